"""Cooldown branches (`llmlab.train.branches`): a branch of a WSD run is, bit for bit on one
process in fp32, the run of its own length with the same warm-up; a rerun skips finished
branches and resumes an interrupted one; the commands take a branch like any run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.conftest import check_cli, run_cli, the_error_line, write_corpus

TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=32", "tokenizer=byte",
        "logger=none", "train.batch_size=2", "train.log_every=1", "train.eval_windows=2", "train.sample_tokens=4",
        "train.prompts=[x]", "train.eval_every=3", "train.ckpt_every=3", "precision=fp32", "sched=wsd"]


def data(root: Path) -> list[str]:
    return ["data=text", f"data.paths=[{root / 'corpus'}/*]"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """``long``: 12 steps with branches ending at 4 and 7; ``four`` and ``seven``: those runs
    on their own (the same settings, ``train.steps=4`` and ``7``)."""
    root = tmp_path_factory.mktemp("branches")
    write_corpus(root)
    for name, length in (("long", ["train.steps=12", "sched.branches=[7,4]"]), ("four", ["train.steps=4"]),
                         ("seven", ["train.steps=7"])):
        r = run_cli("train", *data(root), *TINY, "sched.warmup=1", *length, f"hydra.run.dir={name}", cwd=root)
        assert r.returncode == 0, r.stderr
    return root


def summary(path: Path) -> dict:
    return json.loads((path / "summary.json").read_text())


def final_weights(path: Path) -> dict:
    (ckpt,) = [p for p in (path / "checkpoints").iterdir() if p.name == f"step_{summary(path)['steps']:06d}"]
    return load_file(ckpt / "model.safetensors")


@pytest.mark.parametrize("end,alone", [(4, "four"), (7, "seven")])
def test_a_branch_is_the_run_of_its_length_bit_for_bit(runs, end, alone):
    branch = runs / "long" / "branches" / str(end)
    mine, theirs = summary(branch), summary(runs / alone)
    assert mine["val_loss"] == theirs["val_loss"] and mine["train_loss"] == theirs["train_loss"]
    assert mine["run_id"] == theirs["run_id"] and mine["steps"] == end  # the same run, as report groups runs
    a, b = final_weights(branch), final_weights(runs / alone)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    # its records are the run's: every step's loss, the shared part included, as the run logged it
    def losses(path):
        return [(r["step"], r["train/loss"]) for r in map(json.loads, (path / "metrics.jsonl").read_text().splitlines())
                if "train/loss" in r]
    assert losses(branch) == losses(runs / alone) and [s for s, _ in losses(branch)] == list(range(1, end + 1))
    overrides = (branch / ".hydra" / "overrides.yaml").read_text()
    assert f"train.steps={end}" in overrides and "sched.branches" not in overrides
    assert (branch / "train.log").is_file() and summary(runs / "long")["branches"] == [
        str(runs / "long" / "branches" / "4"), str(runs / "long" / "branches" / "7")]


def test_a_rerun_skips_a_finished_branch_and_resumes_an_interrupted_one(runs, tmp_path):
    """The branch at 7 killed after its checkpoint at step 6 (its summary and final checkpoint
    gone): the same command again says the long run and the branch at 4 are done, and ends
    the branch at 7 from step 6 with the loss of the run of 7 steps."""
    work = tmp_path / "work"
    shutil.copytree(runs / "long", work / "long")
    seven = work / "long" / "branches" / "7"
    (seven / "summary.json").unlink()
    shutil.rmtree(seven / "checkpoints" / "step_000007")
    assert (seven / "checkpoints" / "step_000006").is_dir()
    r = run_cli("train", *data(runs), *TINY, "sched.warmup=1", "train.steps=12", "sched.branches=[7,4]",
                "hydra.run.dir=long", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "finished already" in r.stdout and f"branch 4 steps: finished already in {work / 'long' / 'branches' / '4'}" \
        in r.stdout
    assert f"resumed from {seven / 'checkpoints' / 'step_000006'} at step 6" in r.stdout
    assert summary(seven)["val_loss"] == summary(runs / "seven")["val_loss"]


def test_flop_branches_are_the_budget_runs_with_the_long_runs_warmup(tmp_path):
    """A FLOP-budget run's default warm-up is a share of its length: each branch keeps the long
    run's warm-up (pinned in its settings and command line) and equals the budget run that
    names it."""
    write_corpus(tmp_path)
    long = run_cli("train", *data(tmp_path), *TINY, "train.max_flops=4e8", "sched.branch_flops=[1e8]",
                   "hydra.run.dir=long", cwd=tmp_path)
    assert long.returncode == 0, long.stderr
    (branch,) = (tmp_path / "long" / "branches").iterdir()
    overrides = (branch / ".hydra" / "overrides.yaml").read_text().split()
    assert "train.max_flops=1e+08" in overrides and "sched.warmup=2" in overrides  # 5% of the long run's 37 steps
    alone = run_cli("train", *data(tmp_path), *TINY, "train.max_flops=1e8", "sched.warmup=2", "hydra.run.dir=alone",
                    cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr
    assert summary(branch)["val_loss"] == summary(tmp_path / "alone")["val_loss"]
    assert summary(branch)["run_id"] == summary(tmp_path / "alone")["run_id"]


def test_report_eval_and_sample_take_a_branch_like_any_run(runs, tmp_path):
    branch = runs / "long" / "branches" / "4"
    r = run_cli("report", str(runs / "long" / "branches"), f"out={tmp_path / 'report'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert sorted(len(g["runs"]) for g in report["groups"]) == [1, 1]  # two lengths, two groups
    # in the folder whose cache holds the data it was trained on
    r = run_cli("eval", f"ckpt={branch}", "max_batches=2", f"hydra.run.dir={tmp_path / 'eval'}", cwd=runs)
    assert r.returncode == 0 and "step_000004" in r.stdout, r.stderr
    r = run_cli("sample", f"ckpt={branch}", "prompt=x", "max_new_tokens=2", f"hydra.run.dir={tmp_path / 's'}",
                cwd=runs)
    assert r.returncode == 0 and "step_000004" in r.stderr + r.stdout, r.stderr


@pytest.mark.parametrize("args,fragments", [
    (["train.steps=8", "sched.branches=[8]"], ["sched.branches: 8 is not before the run's end (train.steps=8)"]),
    (["train.steps=8", "sched.branches=[4,-2]"], ["sched.branches: each branch ends at a step >= 1, got -2"]),
    (["train.steps=8", "sched.branches=[4,4]"], ["sched.branches: 4 is given twice"]),
    (["train.steps=8", "sched=cosine", "sched.branches=[4]"], ["sched.branches:", "sched=cosine", "use sched=wsd"]),
    (["train.max_flops=1e9", "sched.branch_flops=[2e9]"],
     ["sched.branch_flops: 2e+09 is not below the run's budget train.max_flops=1e+09"]),
    (["train.steps=8", "sched.warmup=5", "sched.branches=[4]"], ["sched.branches: 4 ends within the warm-up of 5"]),
])
def test_a_branch_that_cannot_be_is_one_line_before_any_work(tmp_path, args, fragments):
    r = check_cli("train", *TINY, *args, cwd=tmp_path)
    line = the_error_line(r.stderr)
    assert r.returncode == 2 and line is not None, r.stderr
    for fragment in fragments:
        assert fragment in line, line
    assert not (tmp_path / "outputs").exists()
