"""Mutations of real input files, shared by the hypothesis suite (tests/fuzz/test_fuzz_inputs.py) and
the corpus runner (tests/fuzz/corpus.py, `make fuzz`).

A document mutation picks a location in the parsed tree (a YAML / JSON document) and breaks it: drop it,
retype it, negate it, make it NaN / inf / huge / zero, spell a number as a word. Text mutations break
the bytes: truncate, invalid UTF-8, binary, gzip, NUL bytes, duplicate keys, self-referencing aliases,
deep nesting. Each mutation says whether the result must be rejected (`must_reject`): a non-finite
number or a negated positive number planted in a field comet reads can never be a valid input.
"""

from __future__ import annotations

import copy
import gzip
import math
import random
from dataclasses import dataclass
from typing import Any

DOC_MUTATIONS = ("drop", "to_str", "to_list", "to_dict", "to_null", "to_bool", "negate", "nan", "inf", "ninf",
                 "huge", "zero", "word", "fraction", "empty_list")
TEXT_MUTATIONS = ("truncate", "bad_utf8", "binary", "gzip", "nul", "bom", "empty", "deep")


@dataclass
class Mutation:
    name: str
    path: str              # where in the document ("" for text mutations)
    must_reject: bool      # an input no correct reader may accept with exit 0


def locations(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys / indexes) in the tree, containers included."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += locations(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += locations(v, prefix + (i,))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def mutate_doc(doc: Any, rng: random.Random, reads: callable = lambda path: True,
               paths: list | None = None) -> tuple[Any, Mutation]:
    """A deep copy of `doc` with one mutation. `reads(path)` says whether comet reads the value at that
    path (decides must_reject for planted NaN / inf / negative numbers)."""
    doc = copy.deepcopy(doc)
    paths = paths if paths is not None else locations(doc)
    numeric = [p for p in paths if _is_number(_get(doc, p))]
    name = rng.choice(DOC_MUTATIONS)
    if name in ("negate", "nan", "inf", "ninf", "huge", "zero", "word", "fraction") and numeric:
        path = rng.choice(numeric)
    else:
        path = rng.choice(paths)
    parent, key = _get(doc, path[:-1]), path[-1]
    old = parent[key]
    must = False
    if name == "drop":
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
    elif name == "to_str":
        parent[key] = str(old) + "x"
    elif name == "to_list":
        parent[key] = [old, old]
    elif name == "to_dict":
        parent[key] = {"value": old}
    elif name == "to_null":
        parent[key] = None
    elif name == "to_bool":
        parent[key] = True
    elif name == "negate":
        parent[key] = -old if _is_number(old) else old
        must = _is_number(old) and old > 0 and reads(path)
    elif name in ("nan", "inf", "ninf"):
        parent[key] = {"nan": math.nan, "inf": math.inf, "ninf": -math.inf}[name]
        must = reads(path)
    elif name == "huge":
        parent[key] = 10 ** rng.choice((12, 19, 30, 400))
    elif name == "zero":
        parent[key] = 0
    elif name == "word":
        parent[key] = "twelve"
    elif name == "fraction":
        parent[key] = (old if _is_number(old) else 1) + 0.5
    elif name == "empty_list":
        parent[key] = []
    return doc, Mutation(name, "/".join(map(str, path)), must)


def mutate_text(data: bytes, rng: random.Random, kind: str = "yaml") -> tuple[bytes, Mutation]:
    """One byte-level mutation of a text file (`kind` is yaml, json or csv)."""
    name = rng.choice(TEXT_MUTATIONS)
    must = name not in ("truncate", "bom")   # a truncated file may still be well-formed; a BOM is legal
    if name == "truncate":
        out = data[:rng.randrange(0, max(1, len(data)))]
        must = False
    elif name == "bad_utf8":
        i = rng.randrange(0, max(1, len(data)))
        out = data[:i] + b"\xff\xfe\xc3" + data[i:]
    elif name == "binary":
        out = bytes(rng.randrange(256) for _ in range(rng.choice((16, 512, 4096))))
    elif name == "gzip":
        out = gzip.compress(data)
        must = kind == "yaml" or kind == "csv"   # trace readers accept gzip by design
    elif name == "nul":
        i = rng.randrange(0, max(1, len(data)))
        out = data[:i] + b"\x00" + data[i:]
    elif name == "bom":
        out = b"\xef\xbb\xbf" + data
    elif name == "empty":
        out = b""
    else:  # deep
        depth = rng.choice((200, 5000, 100000))
        out = (b"[" * depth + b"]" * depth) if kind != "csv" else data + b"," * depth + b"\n"
        must = kind != "csv"
    return out, Mutation(name, "", must)


def yaml_text_attacks(data: bytes, rng: random.Random) -> tuple[bytes, Mutation]:
    """YAML-specific text: a duplicated top-level key, a self-referencing alias, an alias bomb."""
    name = rng.choice(("duplicate_key", "self_alias", "alias_bomb"))
    if name == "duplicate_key":
        lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if ln and ln[0].isalpha() and ":" in ln]
        line = rng.choice(lines) if lines else "name: x"
        out = data + b"\n" + line.encode() + b"\n"
    elif name == "self_alias":
        lines = data.decode("utf-8", "replace").splitlines()
        keys = [i for i, ln in enumerate(lines) if ln and ln[0].isalpha() and ln.rstrip().endswith(":") is False
                and ":" in ln]
        i = rng.choice(keys) if keys else 0
        key = lines[i].split(":", 1)[0] if lines else "x"
        lines[i] = f"{key}: &loop [1, *loop]"
        out = "\n".join(lines).encode()
    else:
        bomb = "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
            f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]\n"
            for i in range(1, 10))
        out = data + b"\n" + bomb.encode()
    return out, Mutation(name, "", True)
