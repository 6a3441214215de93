"""Whole config groups declared as one package (`llmlab.train.groups`): the probe group in a
run, and the declaration itself on a package of the test's own."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch

from llmlab.registry import Registry, declared_groups, parse_dataclass, with_groups
from llmlab.train.checkpoint import build_model, load_checkpoint
from llmlab.train.loop import run_training
from llmlab.train.settings import GROUPS, TrainConfig, check_train_config
from tests.conftest import check_cli, write_corpus
from tests.helpers import composed, config, losses, one_line_error


def _records(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_probe_measures_the_weights_it_watches_and_changes_nothing(tmp_path):
    """probe=residual and probe=weights log their figures at every log step; the figures equal
    what the final checkpoint's weights give by another path (the blocks called by hand, the
    parameters summed); the training is bit for bit the run without a probe, with its run id."""
    corpus = write_corpus(tmp_path)
    runs = {}
    for probe in ({"kind": "none"}, {"kind": "residual", "windows": 1}, {"kind": "weights"}):
        cfg = {**config(corpus, tmp_path, steps=6, log_every=3, eval_every=0, ckpt_every=6), "probe": probe}
        runs[probe["kind"]] = (tmp_path / probe["kind"], check_train_config(cfg))
        run_training(cfg, runs[probe["kind"]][0])
    plain = losses(runs["none"][0])
    assert sorted(plain) == [3, 6] and all(losses(run) == plain for run, _ in runs.values())
    assert len({job.run_id for _, job in runs.values()}) == 1  # a probe only watches: the same run, resumable
    assert not any(k.startswith("probe/") for r in _records(runs["none"][0]) for k in r)

    for kind, prefix in (("residual", "probe/rms_"), ("weights", "probe/weight_rms_")):
        run, job = runs[kind]
        logged = [r for r in _records(run) if "train/loss" in r]
        assert [r["step"] for r in logged] == [3, 6]
        assert all(sorted(k for k in r if k.startswith(prefix)) == [f"{prefix}0", f"{prefix}1"] for r in logged)
        assert logged[0][f"{prefix}0"] != logged[1][f"{prefix}0"]  # the weights moved between the two
        model = build_model(load_checkpoint(run / "checkpoints" / "step_000006"), torch.device("cpu")).eval()
        if kind == "weights":
            expected = [torch.cat([p.detach().flatten() for p in block.parameters()]).pow(2).mean().sqrt().item()
                        for block in model.blocks]
        else:
            from llmlab.data.prepare import prepare

            seq = job.spec.model.max_seq_len
            idx = torch.as_tensor(prepare(job.data, job.tokenizer, job.cache_dir).tokens("val")[:seq].astype("int64"))[None]
            positions = torch.arange(seq)
            x, pos, expected = model.pos.embed(model.embed(idx), positions), model.pos.view(positions), []
            with torch.no_grad():
                for block in model.blocks:
                    x, _ = block(x, pos, positions, None, False)
                    expected.append(x.pow(2).mean().sqrt().item())
        got = [logged[-1][f"{prefix}{i}"] for i in range(len(expected))]
        assert got == pytest.approx(expected, rel=1e-5), kind


def test_a_probe_is_composed_checked_and_listed_like_any_group(tmp_path):

    assert [r.group for r in GROUPS] == ["probe"]
    assert composed()["probe"] == {"kind": "none"}
    assert composed("probe=residual", "probe.windows=3")["probe"] == {"kind": "residual", "windows": 3}
    one_line_error(check_cli("train", "probe=residul", cwd=tmp_path), 2, "probe=residul: unknown option",
                   "none, residual, weights")
    one_line_error(check_cli("train", "probe=residual", "probe.windows=0", cwd=tmp_path), 2,
                   "probe.windows: must be >= 1, got 0")


KIND = """
from dataclasses import dataclass
from toy_groups.colour import COLOUR


@COLOUR.register("{name}")
class {title}:
    '''{title}.'''

    @dataclass
    class Config:
        kind: str = "{name}"
        {setting}
"""
PACKAGE = {
    "__init__.py": "from llmlab.registry import Registry, discover\n"
                   "COLOUR = Registry('colour', group='colour', default='red')\n"
                   "discover(__name__, __path__)\n",
    "red.py": KIND.format(name="red", title="Red", setting="shade: int = 1"),
    "blue.py": KIND.format(name="blue", title="Blue", setting="depth: float = 0.5"),
}


@pytest.fixture
def toy_groups(tmp_path, monkeypatch):
    """A package ``toy_groups`` with one group, ``colour``, declared as its own package; the
    registry it declares is taken back out of llmlab's lists afterwards."""
    root = tmp_path / "src" / "toy_groups"
    (root / "colour").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    for name, text in PACKAGE.items():
        (root / "colour" / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    before = list(Registry.every)
    yield root
    Registry.every[:] = before
    Registry.by_group.pop("colour", None)
    for name in [m for m in sys.modules if m == "toy_groups" or m.startswith("toy_groups.")]:
        del sys.modules[name]


def test_a_whole_group_is_one_package_whose_init_declares_it(tmp_path, toy_groups):
    """A package under a groups package, whose ``__init__`` declares the registry: found, and
    composed by Hydra into the command's config with its default option, another option and a
    setting taken from the command line, and checked by its registry."""
    from dataclasses import dataclass

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from llmlab.registry import store_schema

    groups = declared_groups("toy_groups")
    assert [(r.group, r.default, r.names()) for r in groups] == [("colour", "red", ["blue", "red"])]

    @dataclass
    class Toy:
        size: int = 3

    store_schema("toy_with_groups", with_groups(Toy, groups, for_hydra=True))
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "toy.yaml").write_text("defaults:\n  - /schema/toy_with_groups@_here_\n  - _self_\n")
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        default = OmegaConf.to_container(compose("toy"))
        other = OmegaConf.to_container(compose("toy", overrides=["colour=blue", "colour.depth=0.25", "size=4"]))
    assert default == {"size": 3, "colour": {"kind": "red", "shade": 1}}
    assert other == {"size": 4, "colour": {"kind": "blue", "depth": 0.25}}
    typed = parse_dataclass(with_groups(Toy, groups), other, "")
    assert typed.size == 4 and groups[0].config(typed.colour, "colour").depth == 0.25
    with pytest.raises(Exception, match=r"^colour.shade: unknown key; allowed keys: depth, kind$"):
        groups[0].config({"kind": "blue", "shade": 2}, "colour")


def test_a_groups_package_that_declares_no_group_is_named(toy_groups):
    (toy_groups / "colour" / "__init__.py").write_text("from llmlab.registry import Registry\n"
                                                       "COLOUR = Registry('colour', group='colour')\n")
    with pytest.raises(TypeError, match=r"toy_groups\.colour must declare one Registry with group='colour' and its "
                                         r"default option"):
        declared_groups("toy_groups")


def test_the_train_schema_gains_a_section_per_declared_group_only():
    extended = with_groups(TrainConfig, GROUPS)
    assert extended is with_groups(TrainConfig, GROUPS) and issubclass(extended, TrainConfig)
    added = {f.name for f in dataclasses.fields(extended)} - {f.name for f in dataclasses.fields(TrainConfig)}
    assert added == {r.group for r in GROUPS}
