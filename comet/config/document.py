"""The one gate every YAML input passes (model, cluster, search space): bytes -> a checked document.

Why a gate: a YAML parser accepts far more than comet can use. Binary or gzip data, invalid UTF-8, a
self-referencing alias, an alias bomb, 10,000 nested brackets, a duplicated key (silently last-wins) and
`.nan` / `.inf` numbers all parse; each later became a traceback, a hang or a result computed from garbage.
Here they become one ConfigError naming the file, the key path, the rule and the value.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from comet.errors import ConfigError

MAX_BYTES = 4 * 2**20        # the largest real input (a search space, a cluster spec) is ~5 kB
MAX_DEPTH = 32               # real inputs nest 4 levels deep
MAX_NODES = 100_000          # values after alias expansion: bounds the work of every later walk
MAX_MAGNITUDE = 1e18         # no physical quantity a comet input names is larger (tokens ~1e13, bytes ~1e15)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (YAML's last-one-wins hides typos)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in seen:
                raise ConfigError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1} "
                                  f"(first at line {seen[key] + 1})")
        except TypeError:
            raise ConfigError(f"a key must be a plain value, got {key!r} at line {key_node.start_mark.line + 1}") \
                from None
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def check_path_text(path: str | Path, source: str, field: str | None = None) -> None:
    text = str(path)
    if not text:
        raise ConfigError("the path is empty", source=source or None, field=field)
    if "\x00" in text:
        raise ConfigError(f"a path cannot contain a NUL byte, got {text!r}", source=source or None, field=field)


def read_text(path: str | Path, kind: str = "YAML") -> str:
    """The file's text: exists, is a file, at most MAX_BYTES, not binary, valid UTF-8 (a BOM is allowed)."""
    check_path_text(path, str(path))
    p = Path(path)
    if not p.is_file():
        raise ConfigError("file not found" if not p.exists() else "is not a file", source=str(path))
    try:
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise ConfigError(f"file is {size:,} bytes; a {kind} input may be at most {MAX_BYTES:,} bytes",
                              source=str(path))
        data = p.read_bytes()[:MAX_BYTES + 1]
    except OSError as exc:
        raise ConfigError(f"cannot read file ({exc.strerror or exc})", source=str(path)) from None
    return decode_text(data, str(path), kind)


def decode_text(data: bytes, source: str, kind: str = "YAML") -> str:
    if data[:2] == b"\x1f\x8b":
        raise ConfigError(f"is gzip-compressed; give the uncompressed {kind} file", source=source)
    nul = data.find(b"\x00")
    if nul >= 0:
        raise ConfigError(f"is a binary file (NUL byte at offset {nul}), not {kind} text", source=source)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"is not UTF-8 text: invalid byte 0x{data[exc.start]:02x} at line {line}",
                          source=source) from None


def parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as exc:
        raise ConfigError(str(exc), source=source) from None
    except RecursionError:
        raise ConfigError(f"nested too deeply (at most {MAX_DEPTH} levels)", source=source) from None
    except ValueError as exc:     # e.g. an integer literal longer than Python's 4,300-digit limit
        raise ConfigError(f"unreadable value: {str(exc)[:120]}", source=source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"malformed YAML{at}: {problem}", source=source) from None


def check_document(doc: Any, source: str) -> Any:
    """Walk the parsed document once: no cycles, bounded depth and size, finite bounded numbers."""
    count = 0
    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    ancestors: dict[int, set[int]] = {}      # container id -> ids of its ancestors (cycle check)
    while stack:
        value, path, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ConfigError(f"has more than {MAX_NODES:,} values after expanding aliases (an alias bomb?)",
                              source=source)
        if depth > MAX_DEPTH:
            raise ConfigError(f"nested too deeply (at most {MAX_DEPTH} levels)", source=source, field=path or None)
        if isinstance(value, (dict, list)):
            chain = ancestors.get(id(value), set())
            if isinstance(value, dict):
                items = [(_join(path, k), v) for k, v in value.items()]
            else:
                items = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
            for child_path, child in items:
                if isinstance(child, (dict, list)):
                    if id(child) == id(value) or id(child) in chain:
                        raise ConfigError("refers to itself through a YAML alias", source=source, field=child_path)
                    ancestors[id(child)] = chain | {id(value)}
                stack.append((child, child_path, depth + 1))
        else:
            check_scalar(value, source, path)
    return doc


def check_scalar(value: Any, source: str, path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"must be a finite number, got {value}", source=source, field=path or None)
    if abs(value) > MAX_MAGNITUDE:
        shown = f"{value:.3g}" if isinstance(value, float) else (
            str(value) if abs(value) < 10**24 else f"an integer of ~{int(math.log10(abs(value))) + 1} digits")
        raise ConfigError(f"must be at most {MAX_MAGNITUDE:g} in magnitude, got {shown}",
                          source=source, field=path or None)


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def read_yaml(path: str | Path) -> Any:
    """Read, parse and check one YAML input file; every problem is a ConfigError naming the file."""
    source = str(path)
    return check_document(parse_yaml(read_text(path), source), source)
