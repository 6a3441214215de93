"""Sweep reports on synthetic run directories: grouping, statistics against hand-computed
values, matched-token interpolation, the paired comparison, and the files written."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from llmlab.errors import UserError
from llmlab.eval.runs import find_runs
from llmlab.study.report import build_report, curves, markdown
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
    assert "| model/attention=mqa ‡ | 3 | 3.2167 ± " in md and "![validation loss curves](report.png)" in md
    # 900 against the baseline's 1,000 parameters: the loss difference is partly a size difference
    assert report["size_note"] == ("Sizes differ from the baseline's by more than 5%, so a loss difference is partly "
                                   "a size difference: model/attention=mqa (params -10%).")
    assert "**‡ " + report["size_note"] + "**" in md
    c = curves(runs)["model/attention=mha"]
    assert c["x"] == [1000, 2000, 2500]  # up to where every run of the group has a curve
    assert c["lo"][-1] == pytest.approx(3.00) and c["hi"][-1] == pytest.approx(3.20 + 0.25)


def test_report_command_on_a_sweep_directory(sweep, tmp_path):
    """From a shell, into a pipe: out of a terminal (a log file, a pipe) the tables are printed
    whole, not cut to the 60 columns the environment says."""
    r = run_cli("report", str(sweep), "baseline=mha", "out=rep", process=True, cwd=tmp_path, env={"COLUMNS": "60"})
    assert r.returncode == 0, r.stderr
    assert "model/attention=mqa" in r.stdout and "paired by seed" in r.stdout
    row = next(line for line in r.stdout.splitlines() if "model/attention=mqa" in line and "3.2167" in line)
    assert "3.2167 ± " in row and "…" not in r.stdout
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


def test_the_group_that_sets_none_of_what_sets_the_others_apart_is_the_defaults(tmp_path):
    """A baseline run beside runs that add one setting each: it is "defaults", not "all runs"."""
    root = tmp_path / "sweep"
    for name, extra in (("base", ""), ("post", "- norm=post\n"), ("nope", "- pos=none\n")):
        d = fake_run(root, name, "mha", 0, 3.0)
        (d / ".hydra" / "overrides.yaml").write_text((d / ".hydra" / "overrides.yaml").read_text() + extra)
    assert sorted(g["group"] for g in build_report(find_runs([root]))["groups"]) == ["defaults", "norm=post", "pos=none"]


def test_speeds_carry_their_spread_and_a_contended_group_is_marked(sweep):
    """Each run's speed comes with its spread and the other load while it was timed; a group
    timed under contention is starred, and one line says the columns cannot be compared."""
    for d in sorted(sweep.iterdir()):
        s = json.loads((d / "summary.json").read_text())
        busy = "mqa" in d.name
        s.update(tokens_per_s_spread=0.03, tokens_per_s_other_load=0.6 if busy else 0.02,
                 decode_tokens_per_s_spread=0.01, decode_tokens_per_s_other_load=0.02,
                 decode_setting={"prompt_tokens": 16, "tokens": 48, "batch": 1})
        (d / "summary.json").write_text(json.dumps(s))
    report = build_report(find_runs([sweep]))
    groups = {g["group"]: g for g in report["groups"]}
    mha, mqa = groups["model/attention=mha"], groups["model/attention=mqa"]
    assert mha["train_tokens_per_s_spread"] == pytest.approx(0.03)  # runs' own spread > between seeds (1%)
    assert not mha["train_tokens_per_s_contended"] and mqa["train_tokens_per_s_contended"]
    assert mqa["train_tokens_per_s_other_load"] == 0.6
    assert report["speed_note"] == ("Speed columns are not comparable: 1 of 2 groups were timed while other "
                                    "work used more than 15% of the CPU (marked *).")
    md = markdown(report, None)
    assert "| 101 ±3% | 50 ±1% |" in md and "| 101 ±3% * | 50 ±1% |" in md and report["speed_note"] in md


def test_speeds_of_runs_on_different_devices_or_decode_settings_are_not_compared(sweep):
    for i, d in enumerate(sorted(sweep.iterdir())):
        s = json.loads((d / "summary.json").read_text())
        s.update(device="cuda:0" if i == 0 else "cpu",
                 decode_setting={"prompt_tokens": 16, "tokens": 48 if i else 12, "batch": 1})
        (d / "summary.json").write_text(json.dumps(s))
    note = build_report(find_runs([sweep]))["speed_note"]
    assert note == "Speed columns are not comparable: the runs differ in devices; the runs differ in decode settings."
    for d in sweep.iterdir():  # the same everywhere, and no load known (not Linux): nothing to say
        s = json.loads((d / "summary.json").read_text())
        s.update(device="cpu", decode_setting={"prompt_tokens": 16, "tokens": 48, "batch": 1})
        (d / "summary.json").write_text(json.dumps(s))
    assert build_report(find_runs([sweep]))["speed_note"] is None


def test_a_variants_caveat_is_marked_in_the_report(sweep):
    """A caveat a run's model card carries (swa with a window as long as the context) marks
    its group with † and is written out under the table."""
    caveat = "attention.window=256 >= model.max_seq_len=256: every position sees the whole context"
    for d in sweep.iterdir():
        if "mqa" in d.name:
            s = json.loads((d / "summary.json").read_text())
            (d / "summary.json").write_text(json.dumps({**s, "caveats": [caveat]}))
    report = build_report(find_runs([sweep]))
    md = markdown(report, None)
    assert "| model/attention=mqa † ‡ |" in md and f"**† model/attention=mqa: {caveat}**" in md
    assert "| model/attention=mha |" in md


def test_a_run_without_a_val_loss_is_counted_apart_and_named(sweep, tmp_path):
    """A summary.json with no val_loss (no evaluation finished, or edited by hand) is not
    dropped in silence: its group says how many of its runs the loss stands on, and a note
    names the run, in the terminal and in report.md."""
    gone = next(d for d in sorted(sweep.iterdir()) if d.name.endswith("mqa_1"))
    s = json.loads((gone / "summary.json").read_text())
    del s["val_loss"]
    (gone / "summary.json").write_text(json.dumps(s))
    report = build_report(find_runs([sweep]))
    row = next(g for g in report["groups"] if g["group"] == "model/attention=mqa")
    assert row["seeds"] == 3 and len(row["val_loss_values"]) == 2
    assert row["val_loss_mean"] == pytest.approx((FINAL["mqa"][0] + FINAL["mqa"][2]) / 2)
    assert report["no_loss"] == [str(gone.resolve())]
    md = markdown(report, None)
    assert "| model/attention=mqa ‡ | 3 (2 with a val loss) |" in md
    assert "1 run without a val_loss in summary.json" in md and str(gone.resolve()) in md
    r = run_cli("report", str(sweep), "out=rep", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "1 run without a val_loss" in r.stdout and gone.name in r.stdout
    mha = next(g for g in report["groups"] if g["group"] == "model/attention=mha")
    assert len(mha["val_loss_values"]) == 3 and "| model/attention=mha | 3 |" in md


def test_metrics_lines_that_are_not_json_are_counted_and_named(sweep):
    """A run killed mid-write leaves its last metrics.jsonl line cut short, and a hand edit
    can break any line: the curve is built from the rest, and the report names the file."""
    metrics = next(d for d in sorted(sweep.iterdir()) if d.name.endswith("mha_1")) / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], lines[1][:-3] + "#", *lines[2:], '{"step": 31, "val/lo']))
    runs = find_runs([sweep])
    (damaged,) = [r for r in runs if r.unreadable_lines]
    assert damaged.path == metrics.parent.resolve() and damaged.unreadable_lines == 2
    assert [t for t, _ in damaged.curve] == [2000, 3000]  # the record at 1000 tokens was the edited line
    report = build_report(runs)
    assert report["unreadable_metrics"] == {str(metrics.resolve()): 2}
    assert f"the validation curves: {metrics.resolve()} (2 lines)." in markdown(report, None)
    assert not build_report(find_runs([sweep / "0_mha_0"]))["unreadable_metrics"]


def test_separate_runs_are_labelled_by_what_they_compute_and_the_first_given_is_the_baseline(tmp_path):
    """Watch-only overrides (logger, log interval, sample length, device) are no part of a
    label, as they are no part of the run id; the baseline is the first run named."""
    zeta = fake_run(tmp_path, "zeta", "mqa", 0, 3.0)
    alpha = fake_run(tmp_path, "alpha", "mha", 0, 3.1)
    (zeta / ".hydra" / "overrides.yaml").write_text(
        "- model/attention=mqa\n- logger=none\n- train.log_every=5\n- train.sample_tokens=8\n- device=cpu\n")
    (alpha / ".hydra" / "overrides.yaml").write_text("- model/attention=mha\n- train.log_every=50\n")
    report = build_report(find_runs([zeta, alpha]))
    assert [g["group"] for g in report["groups"]] == ["model/attention=mqa", "model/attention=mha"]
    assert report["baseline"] == "model/attention=mqa"
    assert build_report(find_runs([alpha, zeta]))["baseline"] == "model/attention=mha"
