"""Every default lives once: in a Config dataclass. YAML files pick parts and set what differs
from the schema (a preset's sizes), and never repeat a default or shadow a registered option."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest
import yaml

from llmlab.cli import register_parts
from llmlab.paths import conf_dir
from llmlab.registry import Registry

register_parts()
CONF = Path(conf_dir())
YAMLS = sorted(CONF.rglob("*.yaml"))


def schema_of(path: Path, conf: Path) -> type | None:
    """The dataclass a YAML file's keys belong to."""
    from llmlab.model.config import ModelConfig

    group = path.parent.relative_to(conf).as_posix()
    if group == ".":  # a command's own file
        return importlib.import_module(f"llmlab.commands.{path.stem}").SCHEMA
    if group == "model":
        return ModelConfig
    registry = Registry.by_group.get(group)
    if registry is None:
        return None
    base = next(e for e in yaml.safe_load(path.read_text())["defaults"] if isinstance(e, str) and e != "_self_")
    return registry.config_of(base)


def defaults(cls: type) -> dict:
    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls)}


def check_yaml(path: Path, conf: Path) -> None:
    schema = schema_of(path, conf)
    doc = yaml.safe_load(path.read_text()) or {}
    own = {k: v for k, v in doc.items() if k not in ("defaults", "hydra")}
    compare(own, schema, path.relative_to(conf).as_posix(), "")


def compare(own: dict, schema: type, where: str, prefix: str) -> None:
    known = defaults(schema)
    for key, value in own.items():
        assert key in known, f"{where}: {prefix}{key} is not a setting of {schema.__qualname__}"
        if dataclasses.is_dataclass(known[key]) and isinstance(value, dict):
            compare(value, type(known[key]), where, f"{prefix}{key}.")
            continue
        assert value != known[key], (f"{where}: {prefix}{key}: {value!r} repeats the default in "
                                     f"{schema.__qualname__}; delete it from the YAML")


@pytest.mark.parametrize("path", YAMLS, ids=[p.relative_to(CONF).as_posix() for p in YAMLS])
def test_no_yaml_file_repeats_a_default(path):
    check_yaml(path, CONF)


def test_no_yaml_file_shadows_a_registered_option():
    for group, registry in Registry.by_group.items():
        for name in registry.names():
            assert not (CONF / group / f"{name}.yaml").exists(), f"{group}/{name}.yaml repeats {registry.get(name)}"


def test_the_check_catches_a_repeated_default(tmp_path):
    """The check is not vacuous: a preset, an option or a command file that writes a default
    again fails it."""
    from llmlab.model.config import ModelConfig
    from llmlab.train.settings import LoopConfig

    width, steps = ModelConfig().d_model, LoopConfig().steps
    for rel, text, message in [
            ("model/bad.yaml", f"defaults:\n  - tiny\n  - _self_\nd_model: {width}\n",
             f"d_model: {width} repeats the default in ModelConfig"),
            ("norm/bad.yaml", "defaults:\n  - pre\n  - _self_\neps: 1.0e-5\n", "eps: 1e-05 repeats the default"),
            ("train.yaml", f"defaults:\n  - _self_\ntrain:\n  steps: {steps}\n",
             f"train.steps: {steps} repeats the default in LoopConfig"),
            ("sample.yaml", "defaults:\n  - _self_\ntop_k: 50\n", "top_k: 50 repeats the default in SampleConfig")]:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        with pytest.raises(AssertionError, match=message):
            check_yaml(path, tmp_path)
