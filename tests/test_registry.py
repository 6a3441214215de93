from dataclasses import dataclass, field

import pytest

from llmlab.errors import ConfigError
from llmlab.registry import Registry, parse_dataclass


@dataclass
class Example:
    kind: str = "x"
    n: int = 1
    rate: float = 0.5
    flag: bool = False
    name: str | None = None
    items: list[str] = field(default_factory=list)


def test_parse_checks_types_and_coerces_ints_to_floats():
    cfg = parse_dataclass(Example, {"n": 3, "rate": 2, "flag": True, "items": ["a"]}, "ex")
    assert (cfg.n, cfg.rate, cfg.flag, cfg.items) == (3, 2.0, True, ["a"])
    assert isinstance(cfg.rate, float)


def test_parses_share_no_value_with_each_other():
    """The schema OmegaConf checks against is built once per class; what each parse returns
    is its own (a list default changed in one is not changed in the next)."""
    first = parse_dataclass(Example, {}, "ex")
    first.items.append("changed")
    second = parse_dataclass(Example, {"n": 2}, "ex")
    assert second.items == [] and second.n == 2 and parse_dataclass(Example, None, "ex").n == 1


@pytest.mark.parametrize("data, key", [({"n": "three"}, "ex.n"), ({"rate": "fast"}, "ex.rate"),
                                       ({"flag": "maybe"}, "ex.flag"), ({"items": "a"}, "ex.items")])
def test_parse_names_the_key_with_a_bad_type(data, key):
    with pytest.raises(ConfigError, match=rf"^{key}: expected"):
        parse_dataclass(Example, data, "ex")


def test_misspelt_key_lists_the_allowed_keys():
    with pytest.raises(ConfigError) as e:
        parse_dataclass(Example, {"nn": 2}, "ex")
    msg = str(e.value)
    assert msg.startswith("ex.nn: unknown key")
    assert "flag, items, kind, n, name, rate" in msg
    assert "\n" not in msg


def test_registry_unknown_kind_lists_the_variants():
    reg = Registry("thing")

    @reg.register("a")
    class A:
        @dataclass
        class Config:
            kind: str = "a"

    @reg.register("b")
    class B:
        @dataclass
        class Config:
            kind: str = "b"
            size: int = 2

    assert reg.config({"kind": "b", "size": 5}, "thing").size == 5
    with pytest.raises(ConfigError, match=r"^thing.kind: unknown thing 'c'; allowed: a, b$"):
        reg.config({"kind": "c"}, "thing")
    with pytest.raises(ConfigError, match=r"^thing.size: unknown key"):
        reg.config({"kind": "a", "size": 1}, "thing")
    with pytest.raises(ValueError):
        reg.register("a")(A)


def test_a_declared_choice_is_checked_and_named_with_its_alternatives():
    from llmlab.registry import choice, settings_lines

    @dataclass
    class Picky:
        mode: str | None = choice("fast", ("fast", "slow", None))  # how hard to try

    assert parse_dataclass(Picky, {"mode": None}, "p").mode is None
    with pytest.raises(ConfigError, match=r"^p.mode: unknown 'medium'; allowed: fast, slow, null$"):
        parse_dataclass(Picky, {"mode": "medium"}, "p")
    assert settings_lines(Picky) == ["mode: fast  # fast | slow | null; how hard to try"]


def test_a_declared_range_is_checked_and_kept_by_a_subclass_that_changes_the_default():
    from llmlab.registry import bounded

    @dataclass
    class Base:
        rate: float = bounded(0.5, above=0, below=1)
        n: int | None = bounded(None, at_least=2)

    @dataclass
    class Child(Base):
        rate: float = 0.25  # a new default only

    assert parse_dataclass(Child, {}, "x").rate == 0.25
    with pytest.raises(ConfigError, match=r"^x.rate: must be in \(0, 1\), got 1.0$"):
        parse_dataclass(Child, {"rate": 1.0}, "x")
    with pytest.raises(ConfigError, match=r"^x.n: must be >= 2 or null, got 1$"):
        parse_dataclass(Base, {"n": 1}, "x")
    assert parse_dataclass(Base, {"n": None}, "x").n is None


def test_a_composed_config_changed_by_its_holder_changes_neither_the_store_nor_the_next_compose():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    from llmlab.cli import register_parts
    from llmlab.paths import conf_dir
    from llmlab.registry import config_store

    register_parts("train")
    store = config_store()
    before = OmegaConf.to_yaml(store.load("schema/model.yaml").node)
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name="train"):
        first = compose(config_name="train", overrides=["model=gqa", "attention.kv_heads=2"])
        expected = OmegaConf.to_yaml(first)
        with open_dict(first):
            first.model.d_model = 7
            first.attention.kv_heads = 3
        again = compose(config_name="train", overrides=["model=gqa", "attention.kv_heads=2"])
    assert OmegaConf.to_yaml(again) == expected
    assert (again.model.d_model, again.attention.kv_heads, again.attention.kind) == (96, 2, "gqa")
    assert OmegaConf.to_yaml(store.load("schema/model.yaml").node) == before
