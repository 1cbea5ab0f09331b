"""Signatures: a value with its hash computed once, held as the int of that hash, so a cache key that
holds one is hashed in C; a block's signature (its ops and edges), kept by the block and interned."""

from __future__ import annotations

import weakref

from comet.graph.block import (Block, block_lists, block_table, content as block_content, content_hash,
                               lists_content)
from comet.replay.lru import LRU

_interned = LRU(4096)               # Signature -> its canonical instance (cleared by cache.clear())
_signatures: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class Signature(int):
    """A hashable value with its hash computed once (a block's content is a few hundred fields).
    `hash_value`: the value's hash when the caller has a cheaper one than hash(value); every
    Signature of one kind of value must be hashed the same way (equal values, equal hashes)."""

    # perf (i21c-cache): the object is the int of its hash, so a cache key holding it is hashed in C
    # (int.__hash__) instead of through a Python-level __hash__ (~66 a cold call, one per block look-up);
    # equality stays by value (only __eq__ / __ne__ are Python, and a look-up of an interned signature
    # matches by identity before either runs). Only ==, != and hash are meant for it, not arithmetic.
    # An int subclass cannot have slots: the value lives in the instance __dict__.

    def __new__(cls, value: tuple, hash_value: int | None = None):
        self = int.__new__(cls, hash(value) if hash_value is None else hash_value)
        self._value = value
        return self

    def __reduce__(self):
        return _signature_of, (type(self), self.__dict__, int(self))

    @property
    def value(self) -> tuple:
        return self._value

    __hash__ = int.__hash__

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, Signature) and int.__eq__(self, other)
                                 and self.value == other.value)

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(hash={int(self)})"


def _signature_of(cls, state: dict, hash_value: int) -> Signature:
    """A pickled Signature back: its hash as the int, its attributes as they were."""
    self = int.__new__(cls, hash_value)
    self.__dict__.update(state)
    return self


class BlockSignature(Signature):
    """A block's signature: its content (graph.block.content) hashed by graph.block.content_hash, its
    ops in node order at hand (`ops`). perf: a Block's content tuple is built only when the signature
    is compared with another of the same hash (never on a cold call: ~10 us on the flagship's blocks)."""

    def __new__(cls, ops: list, edges: list | None, value: tuple | None = None, table=None):
        """`table`: the ops' graph/op_table.TableWriter where the builder wrote one (else derived)."""
        self = int.__new__(cls, content_hash(ops, len(edges if value is None else value[1]), table))
        state = self.__dict__
        state["ops"] = ops
        state["_edges"] = edges      # a Block's edge list while the content is not built
        state["_value"] = value
        return self

    @classmethod
    def of(cls, g) -> "BlockSignature":
        lists = block_lists(g)
        if lists is not None:
            return cls(*lists, table=block_table(g))
        value = block_content(g)
        return cls([op for _, op in value[0]], None, value)

    @property
    def value(self) -> tuple:
        if self._value is None:
            self._value = lists_content(self.ops, self._edges)
            self._edges = None
        return self._value


def block_signature(g) -> BlockSignature:
    """Everything of a block graph that its replay reads: node ids and ops (every field) in insertion
    order, edges with their data. Computed once per graph object (blocks are not modified once built)."""
    # perf (i21c-cache): a builder Block keeps its signature in its own __dict__ (dropped when the Block
    # turns into a graph: graph/block.py), as a cluster keeps its keys: no WeakKeyDictionary look-up and
    # weak reference per block (~1 us each, six blocks a cold call). Other graphs are kept in _signatures.
    if type(g) is Block:
        state = g.__dict__
        sig = state.get("_signature")
        if sig is None:
            # equal blocks of different graphs share one Signature object, so cache look-ups compare
            # identities, not every op
            sig = state["_signature"] = _interned.canonical(BlockSignature(*state["_lists"], table=state["_table"]))
        return sig
    sig = _signatures.get(g)
    if sig is None:
        sig = _signatures[g] = _interned.canonical(BlockSignature.of(g))
    return sig

