"""The training loop in-process, on a small corpus."""

import json
import math
from pathlib import Path

import pytest
import torch

from llmlab.train.loop import run_training
from tests.helpers import config


def test_training_lowers_the_validation_loss(corpus_dir, tmp_path):
    summary = run_training(config(corpus_dir, tmp_path), tmp_path / "run")
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if "val/loss" in line]
    assert [e["step"] for e in evals] == [30, 60]
    import math
    assert evals[1]["val/loss"] < math.log(257) - 1  # well below uniform over the bytes
    assert evals[1]["val/loss"] < evals[0]["val/loss"]
    assert summary["val_bpb"] == pytest.approx(evals[1]["val/bpb"])
    assert summary["tokens_per_s_mean"] > 0 and summary["wall_s"] >= summary["elapsed_s"] > 0
    assert summary["checkpoint"].endswith("step_000060")


def test_grad_accumulation_counts_every_micro_batch(corpus_dir, tmp_path):
    summary = run_training(config(corpus_dir, tmp_path, steps=3, grad_accum=2, batch_size=2, log_every=1),
                           tmp_path / "run")
    assert summary["tokens"] == 3 * 2 * 2 * 32
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/tokens"] for r in records if "train/loss" in r] == [128, 256, 384]


def test_resume_continues_the_same_loss_curve(corpus_dir, tmp_path):
    """40 steps straight, against 20 steps + resume from the step-20 checkpoint + 20 steps:
    every logged loss is identical."""
    straight = config(corpus_dir, tmp_path, steps=40, log_every=1, eval_every=20, ckpt_every=20, keep_checkpoints=5)
    run_training(straight, tmp_path / "straight")
    resumed = config(corpus_dir, tmp_path, steps=40, log_every=1, eval_every=20, ckpt_every=20,
                     resume=str(tmp_path / "straight" / "checkpoints" / "step_000020"))
    summary = run_training(resumed, tmp_path / "resumed")

    def losses(run):
        rows = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}

    a, b = losses("straight"), losses("resumed")
    assert sorted(b) == list(range(21, 41))
    assert [a[s] for s in range(21, 41)] == [b[s] for s in range(21, 41)]
    assert summary["tokens"] == 40 * 8 * 32


def test_resume_auto_picks_up_the_run_dir(corpus_dir, tmp_path):
    cfg = config(corpus_dir, tmp_path, steps=6, log_every=1, eval_every=0, ckpt_every=3)
    run_training(cfg, tmp_path / "run")
    again = run_training(cfg, tmp_path / "run")  # the same run started again: nothing left to do
    assert again["steps"] == 6
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4, 5, 6]


def test_a_diverging_run_stops_without_saving(corpus_dir, tmp_path):
    from llmlab.errors import UserError
    cfg = config(corpus_dir, tmp_path, steps=30, log_every=1, eval_every=0, ckpt_every=5)
    cfg["optim"]["lr"] = 1e6  # certain to blow up
    cfg["train"]["grad_clip"] = 0.0
    with pytest.raises(UserError, match=r"^training diverged: the loss is (nan|inf)"):
        run_training(cfg, tmp_path / "run")
    import torch
    from llmlab.train.checkpoint import list_checkpoints, load_checkpoint
    for ckpt in list_checkpoints(tmp_path / "run" / "checkpoints"):
        assert all(torch.isfinite(t).all() for t in load_checkpoint(ckpt).weights.values())


def test_a_last_update_that_overflows_is_caught_by_the_final_evaluation(corpus_dir, tmp_path):
    """The fuzzer's case: optim.lr=1e20 for 2 steps. Each step's own loss is taken before its
    update, so both are finite; the weights after the last update overflow in the forward
    pass. The final evaluation sees it, and nothing is saved or sampled (sampling NaN
    probabilities was a traceback)."""
    from llmlab.errors import UserError
    cfg = config(corpus_dir, tmp_path, steps=2, log_every=1, eval_every=0, ckpt_every=0)
    cfg["optim"]["lr"] = 1e20
    with pytest.raises(UserError, match=r"^training diverged: the validation loss is (nan|inf) at step 2; "
                                        r"nothing was saved after it"):
        run_training(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists() or not list((tmp_path / "run" / "checkpoints").iterdir())
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [math.isfinite(r["train/loss"]) for r in steps if "train/loss" in r] == [True, True]


def test_pruning_keeps_the_best_checkpoint(corpus_dir, tmp_path):
    from llmlab.train.checkpoint import list_checkpoints
    cfg = config(corpus_dir, tmp_path, steps=40, log_every=5, eval_every=10, ckpt_every=10, keep_checkpoints=1)
    cfg["optim"]["lr"] = 3e-2  # overfits: validation loss rises after a while
    summary = run_training(cfg, tmp_path / "run")
    kept = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert kept[-1].name == "step_000040"
    assert summary["best_checkpoint"] in {str(p) for p in kept}
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if "val/loss" in line]
    assert summary["best_val_loss"] == min(e["val/loss"] for e in evals)


def test_fp16_trains_with_a_grad_scaler(corpus_dir, tmp_path):
    cfg = config(corpus_dir, tmp_path, steps=6, log_every=1, eval_every=0)
    cfg["precision"] = "fp16"
    summary = run_training(cfg, tmp_path / "run")
    assert summary["precision"] == "fp16" and summary["val_loss"] is not None
    import math
    assert math.isfinite(summary["val_loss"])


def test_fused_head_loss_follows_the_plain_curve(corpus_dir, tmp_path):
    """train.head_loss=fused (chunked head and loss, no logits kept) trains like the plain head:
    the loss at every step agrees within 1e-5 in fp32."""
    curves = {}
    for mode in ("plain", "fused"):
        cfg = config(corpus_dir, tmp_path, steps=8, log_every=1, eval_every=0, head_loss=mode)
        run_training(cfg, tmp_path / mode)
        rows = [json.loads(line) for line in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()]
        curves[mode] = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(curves["fused"]) == 8 and curves["fused"][-1] < curves["fused"][0]
    assert curves["fused"] == pytest.approx(curves["plain"], abs=1e-5)


def test_fused_head_loss_refuses_fp16(corpus_dir, tmp_path):
    from llmlab.errors import ConfigError
    cfg = config(corpus_dir, tmp_path, steps=2, head_loss="fused")
    cfg["precision"] = "fp16"
    with pytest.raises(ConfigError, match=r"^train.head_loss: fused computes .* use train.head_loss=auto or plain"):
        run_training(cfg, tmp_path / "run")


def test_max_time_stops_and_saves(corpus_dir, tmp_path):
    summary = run_training(config(corpus_dir, tmp_path, steps=1000, eval_every=0, ckpt_every=0, max_time=0.0),
                           tmp_path / "run")
    assert summary["interrupted"] is True and summary["steps"] == 1
    assert summary["checkpoint"].endswith("step_000001")


def test_a_signal_after_the_steps_stop_check_still_ends_with_a_checkpoint(corpus_dir, tmp_path, monkeypatch):
    """SIGTERM delivered after step 3's stop check (while the progress bar updates) is acted on
    at step 4's: the run saves step 4 and stops there, never without a checkpoint."""
    import os
    import signal

    import llmlab.train.loop as loop_module

    real = loop_module.train_progress

    def progress(out, total):
        bar = real(out, total)
        update = bar.update

        def update_then_signal(task, completed=None, **kwargs):
            update(task, completed=completed, **kwargs)
            if completed == 3:
                os.kill(os.getpid(), signal.SIGTERM)
        bar.update = update_then_signal
        return bar

    monkeypatch.setattr(loop_module, "train_progress", progress)
    summary = run_training(config(corpus_dir, tmp_path, steps=1000, eval_every=0, ckpt_every=0), tmp_path / "run")
    assert summary["stopped_by"] == "SIGTERM" and summary["steps"] == 4
    assert summary["checkpoint"].endswith("step_000004") and Path(summary["checkpoint"]).is_dir()


def test_batch_tokens_sets_the_accumulation(corpus_dir, tmp_path):
    from llmlab.errors import ConfigError
    summary = run_training(config(corpus_dir, tmp_path, steps=2, batch_size=2, batch_tokens=256, eval_every=0),
                           tmp_path / "run")
    assert summary["tokens"] == 2 * 256  # 2 steps of 4 micro-batches of 2 x 32 tokens
    with pytest.raises(ConfigError, match=r"^train.batch_tokens: 100 is not a multiple of"):
        run_training(config(corpus_dir, tmp_path, batch_tokens=100), tmp_path / "bad")


def test_an_injected_low_peak_is_measured_again_and_mfu_stays_under_100(corpus_dir, tmp_path, monkeypatch, capsys):
    """A peak cached from a probe under load (1 MFLOP/s here) is below what any run reaches:
    the first log window measures again, one line says so, and no MFU is above 100%."""
    import llmlab.train.mfu as mfu
    cache = Path(config(corpus_dir, tmp_path)["cache_dir"])
    cache.mkdir(parents=True, exist_ok=True)
    mfu.measured_matmul_peak.cache_clear()
    key = mfu._peak_key("cpu", torch.float32, 1024)
    (cache / "peak.json").write_text(json.dumps({key: {"flops": 1e6}}))
    monkeypatch.setenv("LLMLAB_CACHE", str(cache))
    run_training(config(corpus_dir, tmp_path, steps=4, log_every=1, eval_every=0), tmp_path / "run")
    err = capsys.readouterr().err
    assert err.count("reference peak (0.0 GFLOP/s) was below what this run reaches") == 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(0 < r["perf/mfu"] <= 1 for r in rows if "perf/mfu" in r)
    assert json.loads((cache / "peak.json").read_text())[key]["flops"] > 1e8
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["mfu"] <= 1 and summary["tokens_per_s_n"] == 3  # windows after the first
    mfu.measured_matmul_peak.cache_clear()


def test_a_summary_after_a_resume_covers_the_earlier_steps(corpus_dir, tmp_path):
    """A run resumed at its last step (it was killed before writing summary.json) still
    reports the throughput of the steps it ran before."""
    cfg = config(corpus_dir, tmp_path, steps=10, log_every=2, eval_every=0, ckpt_every=10)
    run_training(cfg, tmp_path / "run")
    first = json.loads((tmp_path / "run" / "summary.json").read_text())
    (tmp_path / "run" / "summary.json").unlink()
    again = run_training(cfg, tmp_path / "run")
    assert again["steps"] == 10 and again["tokens_per_s"] == pytest.approx(first["tokens_per_s"])
    assert again["train_loss"] == pytest.approx(first["train_loss"])


@pytest.mark.parametrize("width", [80, 60])
def test_the_live_bar_keeps_step_time_and_loss_readable_in_a_narrow_terminal(width):
    import io

    from rich.console import Console

    from llmlab.train.meter import train_progress
    buf = io.StringIO()
    out = Console(file=buf, width=width, force_terminal=True, color_system=None)
    bar = train_progress(out, 5000)
    task = bar.add_task("train", total=5000, completed=2100, loss="loss 4.812",
                        status="lr 2.95e-03  grad 0.84  3,105 tok/s  MFU 65.3%")
    out.print(bar.make_tasks_table(bar.tasks))
    [line] = buf.getvalue().splitlines()
    assert len(line) <= width and "2100/5000" in line and "0:00:00" in line and "loss 4.812" in line
    assert bar.tasks[task].completed == 2100
