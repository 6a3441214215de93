"""Registries of model, data and training parts, and typed checks of their configs.

A part family (attention, norm, optimizer, ...) has one `Registry`. A variant is a class
with a nested ``Config`` dataclass, registered under a short name::

    @ATTENTION.register("gqa")
    class GroupedQueryAttention(nn.Module):
        @dataclass
        class Config:
            kind: str = "gqa"
            kv_heads: int = 2

The YAML of a config-group option holds ``kind`` and the variant's own settings.
`Registry.config` checks those keys and types against the dataclass, so a misspelt key or
an unknown kind stops with a one-line message naming the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Callable, Mapping

from llmlab.errors import ConfigError


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _check_value(value: Any, tp: Any, key: str) -> Any:
    """Check (and gently coerce) one value against a type annotation."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_value(value, arg, key)
            except ConfigError as e:
                errors.append(e)
        raise errors[0]
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        return [_check_value(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return parse_dataclass(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # no setting means infinity or NaN; budgets say "none" with null
                raise ConfigError(f"{key}: must be a finite number, got {value!r}")
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise TypeError(f"unsupported config annotation {_type_name(tp)} for {key}")


def join_key(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def parse_dataclass(cls: type, data: Mapping[str, Any] | None, prefix: str) -> Any:
    """Build dataclass `cls` from `data`, naming the first bad key as ``prefix.key``."""
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            allowed = ", ".join(sorted(fields))
            raise ConfigError(f"{join_key(prefix, key)}: unknown key; allowed keys: {allowed}")
    values = {}
    for name, field in fields.items():
        if name in data:
            values[name] = _check_value(data[name], hints[name], join_key(prefix, name))
    try:
        obj = cls(**values)
    except TypeError as e:  # a required field with no default is missing
        missing = [n for n, f in fields.items() if n not in values
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        raise ConfigError(f"{join_key(prefix, missing[0] if missing else '?')}: required key is missing") from e
    check = getattr(obj, "check", None)
    if check is not None:
        check(prefix)
    return obj


class Registry:
    """Named variants of one kind of part, each a class with a nested ``Config`` dataclass."""

    def __init__(self, family: str):
        self.family = family
        self._entries: dict[str, type] = {}

    def register(self, name: str) -> Callable[[type], type]:
        def deco(cls: type) -> type:
            if name in self._entries:
                raise ValueError(f"{self.family} '{name}' is registered twice")
            if not dataclasses.is_dataclass(getattr(cls, "Config", None)):
                raise TypeError(f"{cls.__name__} needs a nested Config dataclass")
            self._entries[name] = cls
            cls.kind = name
            return cls
        return deco

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def get(self, name: str, key: str | None = None) -> type:
        if name not in self._entries:
            where = key or f"{self.family}.kind"
            raise ConfigError(f"{where}: unknown {self.family} '{name}'; allowed: {', '.join(self.names())}")
        return self._entries[name]

    def config(self, section: Mapping[str, Any] | None, prefix: str, kind_key: str = "kind") -> Any:
        """Check a config section ``{kind: name, ...settings}`` and return its typed Config."""
        section = dict(section or {})
        if kind_key not in section or section[kind_key] is None:
            raise ConfigError(f"{prefix}.{kind_key}: missing; allowed: {', '.join(self.names())}")
        cls = self.get(str(section[kind_key]), f"{prefix}.{kind_key}")
        return parse_dataclass(cls.Config, section, prefix)

    def build(self, cfg: Any, *args: Any, kind_key: str = "kind", **kwargs: Any) -> Any:
        """Instantiate the variant a checked Config names."""
        cls = self.get(getattr(cfg, kind_key))
        return cls(cfg, *args, **kwargs)
