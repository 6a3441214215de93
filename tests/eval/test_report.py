"""Sweep reports on synthetic run directories: grouping, statistics against hand-computed
values, matched-token interpolation, the paired comparison, and the files written."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from llmlab.errors import UserError
from llmlab.eval.report import build_report, curves, find_runs, markdown
from tests.conftest import run_cli

FINAL = {"mha": [3.00, 3.10, 3.20], "mqa": [3.10, 3.30, 3.25]}


def fake_run(root: Path, name: str, attention: str, seed: int, final: float, tokens_end: int = 3000) -> Path:
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(f"- model/attention={attention}\n- seed={seed}\n- train.steps=30\n")
    summary = {"val_loss": final, "seed": seed, "params": 1000 if attention == "mha" else 900,
               "flops_per_token": 6000, "kv_cache_bytes_per_token": 256 if attention == "mha" else 64,
               "tokens_per_s": 100.0 + seed, "decode_tokens_per_s": 50.0, "mfu": 0.1}
    (d / "summary.json").write_text(json.dumps(summary))
    # val loss falls linearly from final + 1 at 1000 tokens to final at tokens_end
    lines = [json.dumps({"step": 1, "train/loss": 9.0, "train/tokens": 100})]
    for t in (1000, 2000, tokens_end):
        lines.append(json.dumps({"step": t // 100, "val/loss": final + (tokens_end - t) / (tokens_end - 1000),
                                 "train/tokens": t}))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return d


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    i = 0
    for attention, finals in FINAL.items():
        for seed, final in enumerate(finals):
            fake_run(root, f"{i}_{attention}_{seed}", attention, seed, final, tokens_end=3000 if seed else 2500)
            i += 1
    return root


def test_groups_and_statistics(sweep):
    report = build_report(find_runs([sweep]))
    groups = {g["group"]: g for g in report["groups"]}
    assert set(groups) == {"model/attention=mha", "model/attention=mqa"}  # seed and shared overrides left out
    for name, finals in FINAL.items():
        g = groups[f"model/attention={name}"]
        assert g["seeds"] == 3
        assert g["val_loss_mean"] == pytest.approx(np.mean(finals))
        assert g["val_loss_ci95"] == pytest.approx(4.302653 * np.std(finals, ddof=1) / math.sqrt(3), rel=1e-5)
    # the seed-0 runs stop at 2500 tokens: every run is compared there, on its interpolated curve
    assert report["matched_tokens"] == 2500
    at = [f + (3000 - 2500) / 2000 if s else f for s, f in enumerate(FINAL["mha"])]
    assert groups["model/attention=mha"]["val_loss_at_matched_mean"] == pytest.approx(np.mean(at))
    assert groups["model/attention=mqa"]["kv_cache_bytes_per_token"] == 64
    assert groups["model/attention=mha"]["train_tokens_per_s"] == pytest.approx(101.0)


def test_paired_comparison_against_the_baseline(sweep):
    report = build_report(find_runs([sweep]), baseline="mha")
    (c,) = report["comparisons"]
    diffs = np.subtract(FINAL["mqa"], FINAL["mha"])  # 0.10, 0.20, 0.05
    assert c["group"] == "model/attention=mqa" and c["pairs"] == 3
    assert c["diff_mean"] == pytest.approx(diffs.mean())
    # t = mean / (sd / sqrt 3) = 0.11667 / (0.07638 / 1.7321) = 2.6458, 2 df -> two-sided p = 0.1181
    assert c["t_test_p"] == pytest.approx(0.1181, abs=5e-4)
    assert c["sign_test_p"] == pytest.approx(0.25) and (c["better"], c["worse"]) == (0, 3)
    two_seeds = build_report([r for r in find_runs([sweep]) if not r.path.name.endswith("_2")], baseline=0)
    assert two_seeds["comparisons"][0]["t_test_p"] is None  # fewer than 3 seeds: no p-value
    with pytest.raises(UserError, match="baseline: 'gqa' names no single group; allowed: 0: model/attention=mha"):
        build_report(find_runs([sweep]), baseline="gqa")


def test_markdown_and_curves(sweep):
    runs = find_runs([sweep])
    report = build_report(runs)
    md = markdown(report, "report.png")
    assert "| model/attention=mqa | 3 | 3.2167 ± " in md and "![validation loss curves](report.png)" in md
    c = curves(runs)["model/attention=mha"]
    assert c["x"] == [1000, 2000, 2500]  # up to where every run of the group has a curve
    assert c["lo"][-1] == pytest.approx(3.00) and c["hi"][-1] == pytest.approx(3.20 + 0.25)


def test_report_command_on_a_sweep_directory(sweep, tmp_path):
    r = run_cli("report", str(sweep), "baseline=mha", "out=rep", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "model/attention=mqa" in r.stdout and "paired by seed" in r.stdout
    for name in ("report.md", "report.json", "report.png"):
        assert (tmp_path / "rep" / name).is_file()
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["baseline"] == "model/attention=mha"
    missing = run_cli("report", "no/such/dir", cwd=tmp_path)
    assert missing.returncode == 1 and "runs: no/such/dir does not exist" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_groups_follow_job_order_and_labels_count_the_jobs_that_failed(tmp_path):
    """Sweep jobs 0..11: groups come in job order (job 10 after job 2), and a group that is the
    only one left standing is still labelled by what sets it apart from the failed jobs."""
    root = tmp_path / "sweep"
    kinds = ["mha", "mqa", "gqa", "mla", "swa", "mha2"]
    for i in range(12):
        fake_run(root, f"{i}_x", kinds[i // 2], i % 2, 3.0 + i / 100)
    assert [g["group"].split("=")[1] for g in build_report(find_runs([root]))["groups"]] == kinds

    lone = tmp_path / "lone"
    fake_run(lone, "1_ok", "mqa", 0, 3.0)
    failed = lone / "0_failed" / ".hydra"
    failed.mkdir(parents=True)
    (failed / "overrides.yaml").write_text("- model/attention=mha\n- seed=0\n- train.steps=30\n")
    runs = find_runs([lone])
    assert [g["group"] for g in build_report(runs)["groups"]] == ["all runs"]
    others = [["model/attention=mha", "seed=0", "train.steps=30"]]
    assert [g["group"] for g in build_report(runs, others=others)["groups"]] == ["model/attention=mqa"]
    assert list(curves(runs, others)) == ["model/attention=mqa"]


def test_piped_tables_are_printed_whole(sweep, tmp_path):
    """Out of a terminal (a log file, a pipe) the tables are not cut to 80 columns."""
    r = run_cli("report", str(sweep), "out=rep", cwd=tmp_path, env={"COLUMNS": "60"})
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if "model/attention=mqa" in line and "3.2167" in line)
    assert "3.2167 ± " in row and "…" not in r.stdout
