"""Typed loading of YAML into dataclasses, with errors that name the file, the field path and what was expected.

The spec (`inferwatch.spec`) is a tree of dataclasses; `build(cls, data, path)` walks it using the type
hints. Supported field types: str, int, float, bool, Duration, Secret, nested dataclasses, list[T],
dict[str, T] and `T | None`. A dataclass may define `_validate(self, path)` for cross-field checks.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from inferwatch import redaction


class SpecError(ValueError):
    """A spec that cannot be used. The message is one line: `FILE: field.path: what was expected, got what`."""

    def __init__(self, path: str, message: str, file: str | None = None):
        self.path = path
        self.file = file
        self.detail = message
        super().__init__(self._render())

    def _render(self) -> str:
        where = f"{self.path}: " if self.path else ""
        head = f"{self.file}: " if self.file else ""
        return f"{head}{where}{self.detail}"

    def with_file(self, file: str) -> "SpecError":
        return SpecError(self.path, self.detail, file)


_DURATION_RE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?$")


@dataclasses.dataclass(frozen=True, order=True)
class Duration:
    """A Prometheus-style duration (`90s`, `5m`, `1h30m`, `3d`, `250ms`), kept in milliseconds.

    `str()` gives back the canonical Prometheus form so generated rules read like hand-written ones.
    """

    ms: int

    @classmethod
    def parse(cls, text: str | int | float, path: str = "") -> "Duration":
        if isinstance(text, bool):
            raise SpecError(path, f"expected a duration such as '30s' or '5m', got {text!r}")
        if isinstance(text, (int, float)):
            # A bare number is seconds, the unit Prometheus itself uses for bare numbers.
            return cls(int(round(float(text) * 1000)))
        match = _DURATION_RE.match(str(text).strip())
        if not match or not any(match.groups()):
            raise SpecError(path, f"expected a duration such as '30s', '5m' or '1h', got {text!r}")
        d, h, m, s, ms = (int(g) if g else 0 for g in match.groups())
        return cls((((d * 24 + h) * 60 + m) * 60 + s) * 1000 + ms)

    @property
    def seconds(self) -> float:
        return self.ms / 1000.0

    def __str__(self) -> str:
        ms = self.ms
        if ms == 0:
            return "0s"
        out = []
        for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
            if ms >= size:
                out.append(f"{ms // size}{unit}")
                ms %= size
        return "".join(out)


_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


@dataclasses.dataclass(frozen=True)
class Secret:
    """A secret (webhook URL, routing key, token) given by reference, resolved only when used.

    Spec forms: `key: ${ENV_VAR}`, `key_file: /run/secrets/x`, or (discouraged) `key: literal`.
    `repr()`/`str()` never show the value, so a secret cannot leak through a log line or an error.
    """

    env: str | None = None
    file: str | None = None
    literal: str | None = dataclasses.field(default=None, repr=False)
    path: str = ""

    def reveal(self) -> str:
        """The secret's value. Raises SpecError naming the field (never the value) when unresolvable.
        The value is registered with inferwatch.redaction, so no log line or stored error can show it."""
        value = self._resolve()
        redaction.register(value)
        return value

    def _resolve(self) -> str:
        if self.env is not None:
            value = os.environ.get(self.env)
            if value is None or value == "":
                raise SpecError(self.path, f"environment variable {self.env} is not set")
            return value
        if self.file is not None:
            try:
                return Path(self.file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise SpecError(self.path, f"cannot read secret file {self.file}: {exc.strerror}") from None
        return self.literal or ""

    def describe(self) -> str:
        if self.env is not None:
            return f"${{{self.env}}}"
        if self.file is not None:
            return f"file:{self.file}"
        return "<inline>"

    def __str__(self) -> str:
        return f"Secret({self.describe()})"

    __repr__ = __str__


def parse_secret(value: Any, path: str, *, from_file: bool = False) -> Secret:
    if not isinstance(value, str) or not value:
        raise SpecError(path, f"expected a string such as '${{ENV_VAR}}', got {value!r}")
    if from_file:
        return Secret(file=value, path=path)
    m = _ENV_REF.match(value.strip())
    if m:
        return Secret(env=m.group(1), path=path)
    if "${" in value:
        raise SpecError(path, f"expected '${{ENV_VAR}}' (the whole value), got {value!r}")
    return Secret(literal=value, path=path)


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that raises on a key given twice in one mapping (PyYAML keeps the last one silently,
    so a duplicated threshold would be ignored without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:  # unhashable key: the base class reports it
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"duplicate key {key!r} (first at line {first.start_mark.line + 1})", key_node.start_mark)
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, UniqueKeyLoader.construct_mapping)


def load_yaml(data: bytes, file: str) -> Any:
    """Parse YAML bytes with UniqueKeyLoader. Raises SpecError naming `file` (and line/column) when the bytes
    are not UTF-8, not YAML, or repeat a key."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError("", f"not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r}); "
                            "save the file as UTF-8", file) from None
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError("", f"{where}not valid YAML: {problem}", file) from None


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def build(tp: Any, value: Any, path: str = "") -> Any:
    """Convert plain YAML data to `tp`. Raises SpecError at the first value that does not fit."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        # `str | SomeDataclass`: a mapping builds the dataclass, anything else the first type (the short form).
        if isinstance(value, dict):
            for arg in args:
                if dataclasses.is_dataclass(arg):
                    return build(arg, value, path)
        return build(args[0], value, path)
    if tp is Any:
        return value
    if tp is str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise SpecError(path, f"expected a string, got {value!r}")
        return str(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise SpecError(path, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(path, f"expected a number, got {value!r}")
        if not math.isfinite(value):
            # `.nan` would render as `> nan` in a rule, which never fires: a silently disabled alert.
            raise SpecError(path, f"expected a finite number, got {value!r}")
        return float(value)
    if tp is Duration:
        return Duration.parse(value, path)
    if tp is Secret:
        return parse_secret(value, path)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise SpecError(path, f"expected a list, got {value!r}")
        return [build(item, v, _join(path, i)) for i, v in enumerate(value)]
    if origin is dict:
        key_tp, item = typing.get_args(tp)
        if not isinstance(value, dict):
            raise SpecError(path, f"expected a mapping, got {value!r}")
        out = {}
        for k, v in value.items():
            if item is Secret and isinstance(k, str) and k.endswith("_file"):
                out[k[: -len("_file")]] = parse_secret(v, _join(path, k), from_file=True)
                continue
            out[build(key_tp, k, _join(path, k))] = build(item, v, _join(path, k))
        return out
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, path)
    raise TypeError(f"unsupported spec field type {tp!r} at {path}")


def _build_dataclass(cls: type, value: Any, path: str) -> Any:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise SpecError(path, f"expected a mapping, got {value!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.metadata.get("key", f.name): f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, raw in value.items():
        fpath = _join(path, key)
        if isinstance(key, str) and key.endswith("_file") and key[: -len("_file")] in fields:
            f = fields[key[: -len("_file")]]
            if hints[f.name] in (Secret, Secret | None):
                kwargs[f.name] = parse_secret(raw, fpath, from_file=True)
                continue
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise SpecError(fpath, f"unknown field (expected one of: {known})")
        f = fields[key]
        kwargs[f.name] = build(hints[f.name], raw, fpath)
    try:
        obj = cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        missing = [k for k, f in fields.items() if f.name not in kwargs
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        raise SpecError(_join(path, missing[0]) if missing else path,
                        "required field is missing" if missing else str(exc)) from None
    validate = getattr(obj, "_validate", None)
    if validate is not None:
        validate(path)
    return obj


def field(default: Any = dataclasses.MISSING, *, key: str | None = None, doc: str = "", **kw: Any) -> Any:
    """A dataclass field whose YAML key may differ from the attribute (e.g. `for` → `for_`)."""
    metadata = {"doc": doc}
    if key:
        metadata["key"] = key
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=functools.partial(copy.deepcopy, default), metadata=metadata, **kw)
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=metadata, **kw)
    return dataclasses.field(default=default, metadata=metadata, **kw)
