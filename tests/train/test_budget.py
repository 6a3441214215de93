"""Compute budgets: ``train.max_flops`` sets a run's length through its model card, and a sweep
over sizes and budgets ends with the report's scaling section."""

from __future__ import annotations

import json
import math

import pytest

from llmlab.errors import ConfigError
from llmlab.model.attention import ATTENTION
from llmlab.model.transformer import Transformer
from llmlab.train.settings import LoopConfig
from tests.conftest import run_cli, test_config, tiny_spec, write_corpus

TINY = ["model.n_layers=1", "model.n_heads=2", "model.max_seq_len=32", "tokenizer=byte", "logger=none",
        "train.batch_size=2", "train.log_every=5", "train.eval_windows=4", "train.sample_tokens=0",
        "train.eval_every=0", "train.ckpt_every=0"]


@pytest.mark.parametrize("kind", ATTENTION.names())
@pytest.mark.parametrize("d_model", [32, 64])
def test_max_flops_gives_the_steps_of_the_model_card(kind, d_model):
    model = Transformer(tiny_spec(attention=test_config(ATTENTION, kind), d_model=d_model))
    per_token = model.flops_per_token(32)
    tokens_per_step = 4 * 32
    for budget in (per_token * tokens_per_step, 3.5 * per_token * tokens_per_step, 1e12):
        loop = LoopConfig(batch_size=4, max_flops=budget)
        loop.check("train")
        steps = loop.planned_steps(tokens_per_step, per_token)
        # the fewest steps whose FLOPs reach the budget
        assert steps * tokens_per_step * per_token >= budget > (steps - 1) * tokens_per_step * per_token
    product = LoopConfig(max_flops="1e10*3")
    product.check("train")
    assert product.flops_budget() == 3e10 and product.planned_steps(1, 1) == 30_000_000_000
    assert product.max_flops == "1e10*3"  # the check reads the setting and leaves it as written
    with pytest.raises(ConfigError, match=r"^train.max_flops: 1e\+03 is less than one step, which takes 6.4e\+03"):
        LoopConfig(max_flops=1e3).planned_steps(64, 100)
    # a budget of more steps than a run can count never ends (found by the fuzzer: train.max_flops=1e40)
    with pytest.raises(ConfigError, match=r"^train.max_flops: 1e\+40 is 1.56e\+36 steps of 6.4e\+03 FLOPs, past the "
                                          r"9,223,372,036,854,775,807 a run can count"):
        LoopConfig(max_flops=1e40).planned_steps(64, 100)


@pytest.mark.parametrize("value, message", [
    (0, "train.max_flops: must be > 0, got 0"),
    (-6e15, "train.max_flops: must be > 0, got -6e+15"),
    ("6e15*", "train.max_flops: must be a number of FLOPs such as 6e15 or 1e15*6, got '6e15*'"),
    ("lots", "train.max_flops: must be a number of FLOPs such as 6e15 or 1e15*6, got 'lots'"),
])
def test_a_bad_budget_names_its_key(value, message):
    with pytest.raises(ConfigError) as e:
        LoopConfig(max_flops=value).check("train")
    assert str(e.value) == message


def test_a_flops_sweep_over_sizes_ends_with_a_scaling_report(tmp_path, few_replicates):
    """One variant, two sizes, three budgets: each job's length comes from its model card, and
    the sweep's report has the scaling tables and figure."""
    corpus = write_corpus(tmp_path)
    budgets = (1e8, 2e8, 4e8)
    r = run_cli("train", "-m", "model.d_model=16,32", f"train.max_flops={','.join(f'{b:g}' for b in budgets)}",
                "data=text", f"data.paths=[{corpus}/*]", *TINY, "hydra.sweep.dir=sweep", cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = sorted(p for p in (tmp_path / "sweep").iterdir() if (p / "summary.json").is_file())
    assert len(jobs) == 6 and any(j.name.endswith("train.max_flops=1e8") for j in jobs)
    for job in jobs:
        s = json.loads((job / "summary.json").read_text())
        per_step = s["flops_per_token"] * 2 * 32
        assert s["steps"] == s["steps_planned"] == math.ceil(s["max_flops"] / per_step)
        assert s["flops"] == s["tokens"] * s["flops_per_token"] and 0 <= s["flops"] - s["max_flops"] < per_step
    report = json.loads((tmp_path / "sweep" / "report.json").read_text())
    # labelled as typed (1e8), not as the sweep expands it (100000000.0)
    assert "model.d_model=16 train.max_flops=1e8" in [g["group"] for g in report["groups"]]
    section = report["scaling"]
    assert section["size_keys"] == ["model.d_model"] and section["budgets"] == list(budgets)
    (fit,) = section["variants"].values()
    assert fit["points"] == 6 and [b["budget"] for b in fit["per_budget"]] == list(budgets)
    assert "## Scaling" in (tmp_path / "sweep" / "report.md").read_text()
    assert (tmp_path / "sweep" / "scaling.png").stat().st_size > 1000
    assert "scaling: all runs: L = " in r.stdout


def test_a_budget_below_one_step_is_one_line(tmp_path):
    corpus = write_corpus(tmp_path)
    r = run_cli("train", "train.max_flops=1e6", "model.d_model=16", "data=text", f"data.paths=[{corpus}/*]", *TINY,
                "hydra.run.dir=run", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr  # a mistake in the settings
    assert r.stderr.strip().splitlines()[-1].startswith(
        "llmlab: error: train.max_flops: 1e+06 is less than one step, which takes ")
    assert not (tmp_path / "run" / "checkpoints").exists()
