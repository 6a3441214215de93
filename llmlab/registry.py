"""Registries of model, data and training parts; their Config dataclasses are the schema.

A part family (attention, position, optimizer, ...) has one `Registry`. A variant is a class
with a nested ``Config`` dataclass, registered under a short name::

    @ATTENTION.register("gqa")
    class GroupedQueryAttention(Attention):
        \"\"\"Grouped-query attention (...): the first docstring line is its --help line.\"\"\"

        @dataclass
        class Config:
            kind: str = "gqa"
            kv_heads: int = 2  # key/value heads, each shared by n_heads / kv_heads query heads

Registering also stores the Config in Hydra's ConfigStore as an option of the family's config
group (``model/attention=gqa``), so the dataclass is the only place a default is written: no
YAML file repeats it. OmegaConf checks types and keys when Hydra composes; `parse_dataclass`
runs the same check for a plain mapping (a checkpoint's config, the Python API) and turns
OmegaConf's errors into llmlab's one line that names the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import typing
from typing import Any, Callable, Mapping, Sequence

from llmlab.errors import ConfigError

_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list",
               dict: "a mapping"}


def join_key(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix and key else (prefix or key)


def _expected(object_type: Any, key: Any) -> str | None:
    """How a field's type reads in an error message: 'an integer', 'a list', ..."""
    if not (dataclasses.is_dataclass(object_type) and isinstance(key, str)):
        return None
    tp = typing.get_type_hints(object_type).get(key)
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) is not list else []
    tp = args[0] if len(args) == 1 else tp
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return _TYPE_WORDS.get(typing.get_origin(tp) or tp)


def omegaconf_error(e: Exception, prefix: str = "") -> ConfigError:
    """One line for an OmegaConf error: the full key, and the allowed keys or the expected type."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    key = join_key(prefix, str(getattr(e, "full_key", "") or ""))
    owner = getattr(e, "object_type", None)
    if isinstance(e, (ConfigKeyError, ConfigAttributeError)):
        allowed = sorted(f.name for f in dataclasses.fields(owner)) if dataclasses.is_dataclass(owner) else []
        return ConfigError(f"{key}: unknown key" + (f"; allowed keys: {', '.join(allowed)}" if allowed else ""))
    word = _expected(owner, getattr(e, "key", None))
    if word is not None and (getattr(e, "value", None) is not None or isinstance(e, ValidationError)):
        # a null where the field takes none is a ValidationError with no value: said as written
        hint = ""
        if word == "a list" and isinstance(e.value, str) and e.value.startswith("[") and e.value.endswith("]"):
            # Hydra's grammar takes [a=b] as text: an element with '=' (a sweep job's directory) needs quotes
            hint = f"; quote an element that holds '=': {key}=['a=b',c]"
        choices = _choices(owner, getattr(e, "key", None))
        if choices:  # a choice given null (or another type): the allowed values, as an unknown value gets
            hint = f"; allowed: {', '.join('null' if c is None else str(c) for c in choices)}"
        return ConfigError(f"{key}: expected {word}, got {'null' if e.value is None else repr(e.value)}{hint}")
    if "does not support deletion" in str(e):  # ~key on a field of a schema
        return deletion_error(key)
    return ConfigError(f"{key}: {str(e).strip().splitlines()[0]}")


def _choices(owner, key) -> tuple | None:
    """The values a `choice` field of dataclass ``owner`` allows, or None."""
    if not dataclasses.is_dataclass(owner) or not isinstance(key, str):
        return None
    field = next((f for f in dataclasses.fields(owner) if f.name == key), None)
    return field.metadata.get("choices") if field is not None else None


def deletion_error(key: str) -> ConfigError:
    """``~key`` on a setting: Hydra would delete it, and the schema's default take its place."""
    return ConfigError(f"{key}: a setting cannot be deleted (~{key}); give it a value ({key}=...) or leave it out")


def choice(default: Any, allowed: Sequence[Any]) -> Any:
    """A setting that takes one of ``allowed`` (None is written null): the schema declares the
    choices, `parse_dataclass` checks them, ``--help`` shows them."""
    return dataclasses.field(default=default, metadata={"choices": tuple(allowed)})


class Checked:
    """A settings dataclass whose fields depend on each other in ways a type, a range or a
    choice cannot say (``top_k <= n_experts``): it declares so by deriving from this, and
    `parse_dataclass` calls its ``check(prefix)``, which raises a ConfigError naming the key."""

    def check(self, prefix: str) -> None:
        raise NotImplementedError


def bounded(default: Any, *, at_least: float | None = None, above: float | None = None,
            at_most: float | None = None, below: float | None = None) -> Any:
    """A number setting with a declared range (null passes where the default is null): the
    schema says it beside the field, `parse_dataclass` checks it, and the one-line error
    reads ``key: must be >= 1, got 0`` or ``key: must be in [0, 1), got 1.5``."""
    low = (at_least, "[", ">=") if at_least is not None else (above, "(", ">") if above is not None else None
    high = (at_most, "]", "<=") if at_most is not None else (below, ")", "<") if below is not None else None
    return dataclasses.field(default=default, metadata={"range": (low, high)})


# A width may be written relative to a model size: ``d_model/4``, ``0.5*d_model``, ``max_seq_len/2``.
WIDTH_TEXT = re.compile(r"^\s*(?:(?P<pre>[0-9.eE+]+)\s*\*\s*)?(?P<name>[a-z_]+)\s*"
                        r"(?:(?P<op>[*/])\s*(?P<post>[0-9.eE+]+))?\s*$")


def width(default: Any, *, relative_to: Sequence[str] = ("d_model",), at_least: float | None = 1) -> Any:
    """A size setting (a latent's width, a window) given as an integer or relative to a model
    size (``relative_to``): ``d_model/4`` or ``0.5*d_model`` is resolved to the nearest integer
    for the model at hand (`parse_dataclass`'s ``sizes``), so a size sweep keeps the part the
    same design at every width. Typed ``Any`` so that the text passes Hydra's composition; the
    check after resolution wants an integer in the declared range."""
    low = (at_least, "[", ">=") if at_least is not None else None
    return dataclasses.field(default=default, metadata={"range": (low, None), "relative_to": tuple(relative_to)})


def relative_width(value: str, sizes: Mapping[str, int], allowed: Sequence[str], key: str) -> int:
    """``d_model/4`` with ``sizes={'d_model': 128}`` -> 32 (rounded to the nearest integer)."""
    m = WIDTH_TEXT.match(value)
    names = " or ".join(f"{n}/4, 0.5*{n}" for n in allowed)
    if not m or m.group("name") not in allowed or (m.group("op") and m.group("pre")):
        raise ConfigError(f"{key}: expected an integer or a width relative to {', '.join(f'model.{n}' for n in allowed)} "
                          f"such as {names}, got {value!r}")
    if m.group("name") not in sizes:
        raise ConfigError(f"{key}: {value!r} is relative to model.{m.group('name')}, which is not known here")
    try:
        factor = float(m.group("pre") or 1)
        post = float(m.group("post") or 1)
        factor = factor / post if m.group("op") == "/" else factor * post
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"{key}: expected a number in {value!r}") from None
    if not math.isfinite(factor) or factor <= 0:
        raise ConfigError(f"{key}: the factor in {value!r} must be a positive number")
    return int(round(factor * sizes[m.group("name")]))


def _declared(cls: type, name: str, what: str) -> Any:
    """Field ``name``'s declared ``what`` (a range, the choices), from the nearest class in the
    MRO that declares one: a subclass that only changes a default keeps its base's range."""
    for base in cls.__mro__:
        if dataclasses.is_dataclass(base):
            for f in dataclasses.fields(base):
                if f.name == name and what in f.metadata:
                    return f.metadata[what]
    return None


def _in_range(value: Any, bounds: tuple) -> bool:
    low, high = bounds
    return ((low is None or (value >= low[0] if low[1] == "[" else value > low[0]))
            and (high is None or (value <= high[0] if high[1] == "]" else value < high[0])))


def _range_text(bounds: tuple, nullable: bool) -> str:
    low, high = bounds
    if low is not None and high is not None:
        return f"in {low[1]}{low[0]}, {high[0]}{high[1]}"
    side = low or high
    return f"{side[2]} {side[0]}" + (" or null" if nullable else "")


def _name(value: Any) -> str:
    return "null" if value is None else str(value)


INT64 = 2 ** 63  # what torch and numpy hold: an integer setting past it overflows where it is used
FLOAT32_MAX = 3.4028234663852886e38  # a number setting reaches float32 tensors (an lr, a scale): past it, an overflow there


def _check(obj: Any, prefix: str) -> None:
    """What a type cannot say: a declared choice or range, no setting means infinity or NaN (a
    budget says "none" with null), and a `Checked` dataclass's own ``check(prefix)``
    (relations between settings), nested ones first."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        allowed = _declared(type(obj), f.name, "choices")
        if allowed is not None and value not in allowed:
            raise ConfigError(f"{join_key(prefix, f.name)}: unknown '{_name(value)}'; allowed: "
                              f"{', '.join(map(_name, allowed))}")
        relative = _declared(type(obj), f.name, "relative_to")
        not_int = isinstance(value, bool) or not isinstance(value, int)
        if relative is not None and not_int and (value is not None or f.default is not None):  # null only where the default is null (ffn.hidden)
            raise ConfigError(f"{join_key(prefix, f.name)}: expected an integer or a width relative to "
                              f"{', '.join(f'model.{n}' for n in relative)} such as {relative[0]}/4, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{join_key(prefix, f.name)}: must be a finite number, got {value!r}")
        if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
            raise ConfigError(f"{join_key(prefix, f.name)}: {value} is out of range; an integer setting is "
                              f"between {-INT64:,} and {INT64 - 1:,}")
        bounds = _declared(type(obj), f.name, "range")
        if bounds is not None and value is not None and not _in_range(value, bounds):
            raise ConfigError(f"{join_key(prefix, f.name)}: must be {_range_text(bounds, f.default is None)}, "
                              f"got {value}")
        if isinstance(value, float) and abs(value) > FLOAT32_MAX and _expected(type(obj), f.name) == "a number":
            # a field typed float (not Any: train.max_flops has its own line)
            raise ConfigError(f"{join_key(prefix, f.name)}: {value:g} is out of range; a number setting is at most "
                              f"{FLOAT32_MAX:.3g} in size (float32's largest)")
        if dataclasses.is_dataclass(value):
            _check(value, join_key(prefix, f.name))
    if isinstance(obj, Checked):
        obj.check(prefix)


@functools.lru_cache(maxsize=None)
def _schema(cls: type) -> Any:
    """``cls`` as an OmegaConf structured config, made once: building it took two thirds of a
    `parse_dataclass`, which a command calls a dozen times."""
    from omegaconf import OmegaConf
    return OmegaConf.structured(cls)


def parse_dataclass(cls: type, data: Mapping[str, Any] | Any | None, prefix: str,
                    sizes: Mapping[str, int] | None = None) -> Any:
    """Build dataclass `cls` from `data` (a mapping, or a `cls` already), checked by OmegaConf
    against the dataclass; the first bad key is a ConfigError naming it as ``prefix.key``.
    A `width` written relative to a model size is resolved with ``sizes`` first. Then
    `_check` tests what a type cannot say."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(data, Mapping):
        data = dict(data)
        for key, value in data.items():
            relative = _declared(cls, key, "relative_to") if isinstance(key, str) else None
            if relative is not None and isinstance(value, str):
                data[key] = relative_width(value, sizes or {}, relative, join_key(prefix, key))
    try:
        obj = OmegaConf.to_object(OmegaConf.merge(_schema(cls), data or {}))  # merge copies the schema
    except OmegaConfBaseException as e:
        raise omegaconf_error(e, prefix) from None
    _check(obj, prefix)
    return obj


def first_sentence(text: str) -> str:
    """The first sentence of a text's first paragraph ("et al." does not end one)."""
    paragraph = " ".join(text.strip().split("\n\n")[0].split())
    m = re.search(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)\.(\s+(?=[A-Z`])|$)", paragraph)
    return paragraph[:m.start() + 1] if m else paragraph


def doc_line(cls: type) -> str:
    """What `--help` says of a registered option: its class docstring's first sentence."""
    return first_sentence(cls.__dict__.get("__doc__") or "")


def defaults_text(cls: type, skip: str = "kind") -> str:
    """A Config's settings and defaults in one line: ``kv_heads=2, window=64``."""
    parts = []
    for f in dataclasses.fields(cls):
        if f.name == skip:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        text = default if isinstance(default, (int, float)) and not isinstance(default, bool) else json.dumps(default)
        parts.append(f"{f.name}={text}")
    return ", ".join(parts)


def section(*, default: Any = None) -> Any:
    """A field that a config group fills (``data``, ``model``, ``attention``...): typed ``Any``
    in the schema, checked by the part's own registry."""
    return dataclasses.field(default=default, metadata={"section": True})


def settings_lines(cls: type, indent: int = 0) -> list[str]:
    """A Config dataclass as YAML: each field with its default and the comment its source line
    carries (what `--help` prints). Sections that config groups fill are left out."""
    import inspect

    from omegaconf import OmegaConf

    source = inspect.getsource(cls).splitlines()
    out = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("section"):
            continue
        line = next((ln for ln in source if ln.strip().startswith(f"{f.name}:")), "")
        comment = line.split("  # ", 1)[1].strip() if "  # " in line else ""
        choices, bounds = _declared(cls, f.name, "choices"), _declared(cls, f.name, "range")
        if choices is not None:
            comment = " | ".join(map(_name, choices)) + (f"; {comment}" if comment else "")
        if bounds is not None:
            comment = _range_text(bounds, f.default is None) + (f"; {comment}" if comment else "")
        relative = _declared(cls, f.name, "relative_to")
        if relative is not None:
            comment = f"or relative: {relative[0]}/4; " + comment
        pad = " " * indent
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            out.append(f"{pad}{f.name}:" + (f"  # {comment}" if comment else ""))
            out += settings_lines(type(default), indent + 2)
            continue
        value = (json.dumps(default) if isinstance(default, (list, dict)) else
                 OmegaConf.to_yaml({"v": default}).strip()[3:].strip())
        out.append(f"{pad}{f.name}: {value}" + (f"  # {comment}" if comment else ""))
    return out


def config_store():
    """Hydra's ConfigStore, the process's one instance, where the schemas and options go."""
    from hydra.core.config_store import ConfigStore

    return ConfigStore.instance()


def store_schema(name: str, node: type) -> type:
    """Store a command's (or a section's) Config dataclass as ``schema/<name>``, which the
    command's YAML pulls in first (``- /schema/<name>@_here_``)."""
    config_store().store(group="schema", name=name, node=node, provider="llmlab")
    return node


class Registry:
    """Named variants of one kind of part: each a Config dataclass (the option a config group
    offers) and the class it builds.

    ``group`` is the Hydra config group whose options are the variants (``None``: a setting
    inside another section, as ``norm.kind`` is), ``package`` where the chosen option's
    settings land, and ``kind_key`` the Config field that names the variant.

    A variant's Config is nested in its class (``@REG.register(name)`` stores both). A family
    whose classes need torch names the package that holds them (``impl``), imported when a
    config names one of its kinds, when a part is built, or when every kind is listed. The few
    kinds the default config is made of declare their Configs on their own in a module without
    torch (``@REG.option(name)``), their classes registered under the same names in ``impl``,
    so that composing or checking the default config imports no torch."""

    by_group: dict[str, "Registry"] = {}
    every: list["Registry"] = []

    def __init__(self, family: str, group: str | None = None, package: str | None = None, kind_key: str = "kind",
                 impl: str | None = None, default: str | None = None, watches: bool = False):
        self.family = family
        self.group = group
        self.package = package
        self.kind_key = kind_key
        self.impl = impl
        # a whole config group declared with its registry (`declared_groups`): the option a run
        # gets when it names none, and whether its parts only watch a run (out of the run id)
        self.default = default
        self.watches = watches
        self._configs: dict[str, type] = {}
        self._entries: dict[str, type] = {}
        self._on_register: list[Callable[[str, type], None]] = []
        self._loaded = impl is None
        Registry.every.append(self)
        if group is not None:
            Registry.by_group[group] = self

    def option(self, name: str) -> Callable[[type], type]:
        """Declare variant ``name`` by its Config dataclass: an option of the config group."""
        def deco(config: type) -> type:
            if not dataclasses.is_dataclass(config):
                raise TypeError(f"{self.family} '{name}': a Config must be a dataclass")
            if name in self._configs:
                raise ValueError(f"{self.family} '{name}' is registered twice")
            if getattr(config(), self.kind_key, None) != name:
                raise TypeError(f"{config.__qualname__}.{self.kind_key} must default to '{name}'")
            self._configs[name] = config
            if self.group is not None:
                config_store().store(group=self.group, name=name, node=config, package=self.package,
                                     provider="llmlab")
            for hook in self._on_register:
                hook(name, config)
            return config
        return deco

    def register(self, name: str) -> Callable[[type], type]:
        """Register the class of variant ``name``: its nested ``Config``, or the one declared
        with `option`."""
        def deco(cls: type) -> type:
            if name in self._entries:
                raise ValueError(f"{self.family} '{name}' is registered twice")
            nested = cls.__dict__.get("Config")
            if nested is not None:
                self.option(name)(nested)
            elif name in self._configs:
                cls.Config = self._configs[name]
            else:
                raise TypeError(f"{cls.__name__} needs a nested Config dataclass or a {self.family} option '{name}'")
            self._entries[name] = cls
            cls.kind = name
            return cls
        return deco

    def on_register(self, hook: Callable[[str, type], None]) -> None:
        """Call ``hook(name, config)`` for every variant, declared already or later."""
        self._on_register.append(hook)
        for name, config in self._configs.items():
            hook(name, config)

    def names(self) -> list[str]:
        self._load()
        return sorted(self._configs)

    def _load(self) -> None:
        """Import ``impl`` and, where it is a package, every module in it: a kind written as
        one file there (its class with a nested Config) is found with no other edit."""
        if self._loaded:
            return
        import importlib
        import pkgutil

        self._loaded = True
        module = importlib.import_module(self.impl)
        for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
            if not info.name.startswith("_"):
                importlib.import_module(f"{self.impl}.{info.name}")

    @classmethod
    def all_loaded(cls) -> bool:
        return all(registry._loaded for registry in cls.every)

    @classmethod
    def load_all(cls) -> None:
        """Every registry's kinds, so Hydra's ConfigStore offers them all (before composing)."""
        for registry in list(cls.every):
            registry._load()

    def items(self) -> list[tuple[str, type]]:
        self._load()
        return sorted(self._entries.items())

    def __contains__(self, name: str) -> bool:
        if name not in self._configs:
            self._load()
        return name in self._configs

    def _unknown(self, name: str, key: str | None) -> ConfigError:
        where = key or f"{self.family}.{self.kind_key}"
        return ConfigError(f"{where}: unknown {self.family} '{name}'; allowed: {', '.join(self.names())}")

    def config_of(self, name: str, key: str | None = None) -> type:
        """Variant ``name``'s Config dataclass (importing no class)."""
        if name not in self:
            raise self._unknown(name, key)
        return self._configs[name]

    def describe(self, name: str) -> str:
        """What ``--help`` says of a variant: its Config's docstring, else its class's."""
        config = self.config_of(name)
        auto = (config.__dict__.get("__doc__") or "").startswith(f"{config.__name__}(")  # the signature dataclass writes
        return (not auto and doc_line(config)) or doc_line(self.get(name))

    def get(self, name: str, key: str | None = None) -> type:
        """Variant ``name``'s class."""
        self.config_of(name, key)
        self._load()
        if name not in self._entries:
            raise TypeError(f"{self.family} '{name}' has a Config but no registered class in {self.impl}")
        return self._entries[name]

    def config(self, section: Mapping[str, Any] | Any | None, prefix: str, sizes: Mapping[str, int] | None = None) -> Any:
        """Check a config section ``{kind: name, ...settings}`` and return its typed Config
        (``sizes``: the model's, for settings written relative to them)."""
        if dataclasses.is_dataclass(section):
            section = dataclasses.asdict(section)
        pick = f"; to pick one, write {self.group}=NAME" if self.group else ""
        if section is None:  # `ffn=null` (or no section): refused, not a default picked
            raise ConfigError(f"{prefix}: missing{pick}; allowed: {', '.join(self.names())}")
        if not isinstance(section, Mapping):  # `attention=qknorm` sets the section itself to a word
            raise ConfigError(f"{prefix}: expected its settings (a mapping), got {section!r}{pick}; "
                              f"allowed: {', '.join(self.names())}")
        section = dict(section)
        if section.get(self.kind_key) is None:
            raise ConfigError(f"{prefix}.{self.kind_key}: missing; allowed: {', '.join(self.names())}")
        config = self.config_of(str(section[self.kind_key]), f"{prefix}.{self.kind_key}")
        return parse_dataclass(config, section, prefix, sizes)

    def default_config(self) -> Any:
        """The Config of the option a run gets when it names none (a declared group's ``default``)."""
        return self.config_of(self.default)()

    def build(self, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        """Instantiate the variant a checked Config names."""
        cls = self.get(getattr(cfg, self.kind_key))
        return cls(cfg, *args, **kwargs)


def discover(package: str, path: Any) -> None:
    """Import every module of a family's package (``discover(__name__, __path__)`` at the end of
    its ``__init__``): each registers its kinds, so a new kind is one new file there. For the
    families whose classes need no torch; the others are found the same way when first used
    (`Registry` with ``impl``)."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(path):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


def declared_groups(package: str) -> tuple["Registry", ...]:
    """The config groups declared under ``package``: each subpackage's ``__init__`` declares one
    `Registry` with its ``default`` option (and finds its kinds, `discover`), so a whole new
    group is that one package. Imported in name order; a subpackage that declares no such
    registry is a mistake of the tree, said as one."""
    import importlib
    import pkgutil

    found = []
    for info in sorted(pkgutil.iter_modules(importlib.import_module(package).__path__), key=lambda i: i.name):
        if not info.ispkg or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        declared = [v for v in vars(module).values() if isinstance(v, Registry) and v.group == info.name]
        if len(declared) != 1 or declared[0].default is None:
            raise TypeError(f"{package}.{info.name} must declare one Registry with group='{info.name}' and its default "
                            "option (Registry(..., group=..., default=...))")
        found.append(declared[0])
    return tuple(found)


@functools.lru_cache(maxsize=None)
def with_groups(schema: type, groups: tuple["Registry", ...], for_hydra: bool = False) -> type:
    """``schema`` with a section for each declared group (`declared_groups`), checked by the
    group's registry like every section. ``for_hydra``: the node stored in Hydra's ConfigStore,
    whose defaults list picks each group's default option (after the schema's own fields, so
    the option's settings fill its section); the command line picks another as for any group."""
    if not groups:
        return schema
    fields = [(r.group, Any, section()) for r in groups]
    if for_hydra:
        picks = ["_self_", *({f"/{r.group}": r.default} for r in groups)]
        fields.append(("defaults", list, dataclasses.field(default_factory=lambda: list(picks))))
    extended = dataclasses.make_dataclass(schema.__name__, fields, bases=(schema,))
    extended.__module__, extended.__doc__ = schema.__module__, schema.__doc__
    return extended

