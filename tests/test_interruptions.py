"""Interruptions of a real `llmlab train` process: SIGINT and SIGTERM save a checkpoint and
exit cleanly (also in the middle of a sweep, which the same command then finishes), and a
kill -9 at any moment loses only the steps since the last checkpoint.

In a file of their own so that pytest-xdist can run them beside test_cli's tests, which share
one trained run."""

import json
import re

import pytest

from tests.helpers import TINY


# one signal in the fast tier: both reach the same handler (`StopPolicy`); SIGTERM in the slow one
@pytest.mark.parametrize("sig", ["SIGINT", pytest.param("SIGTERM", marks=pytest.mark.slow)])
def test_a_signal_saves_a_checkpoint_and_exits_cleanly(tmp_path, sig):
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO, SAMPLE_TEXTS, seed_peak
    (tmp_path / "c.txt").write_text("".join(SAMPLE_TEXTS.values()) * 5)
    env = {**os.environ, "LLMLAB_CACHE": str(tmp_path / ".cache"), "PYTHONPATH": str(REPO)}
    seed_peak(tmp_path / ".cache")
    cmd = [sys.executable, "-m", "llmlab", "train", "data=text", f"data.paths={tmp_path}/c.txt", *TINY,
           "train.steps=100000", "train.ckpt_every=0", "train.eval_every=0", "hydra.run.dir=run"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        time.sleep(0.2)
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert f"stopped by {sig}" in out and "hydra.run.dir=" in out
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert len(ckpts) == 1 and ckpts[0].startswith("step_")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["stopped_by"] == sig
    assert summary["steps"] == int(ckpts[0].split("_")[1])


@pytest.mark.slow  # two sweeps in fresh processes; the fast tier has the signal in one run and a sweep resumed
def test_a_signal_stops_the_whole_sweep_and_the_same_command_finishes_it(tmp_path):
    """^C in job 0 of a sweep: job 0 saves and the sweep ends there with status 0 (job 1 is not
    started); the same command then resumes job 0, runs job 1 and writes the report."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO, SAMPLE_TEXTS, seed_peak
    (tmp_path / "c.txt").write_text("".join(SAMPLE_TEXTS.values()) * 5)
    env = {**os.environ, "LLMLAB_CACHE": str(tmp_path / ".cache"), "PYTHONPATH": str(REPO)}
    seed_peak(tmp_path / ".cache")
    # steps of tens of ms, so that the signal (after 3 logged steps) lands well inside job 0's 60
    model = ["model.d_model=128", "model.n_layers=2", "model.n_heads=2", "model.max_seq_len=64", "train.batch_size=8"]
    cmd = [sys.executable, "-m", "llmlab", "train", "-m", "seed=0,1", "data=text", f"data.paths={tmp_path}/c.txt",
           *model, *TINY[4:], "train.steps=60", "train.ckpt_every=0", "train.eval_every=0", "hydra.sweep.dir=sweep"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "sweep" / "0_seed=0" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "To continue, run the same sweep command" in out
    assert "sweep stopped by SIGINT: the jobs after job 0 were not started" in out
    first = json.loads((tmp_path / "sweep" / "0_seed=0" / "summary.json").read_text())
    assert first["stopped_by"] == "SIGINT" and first["steps"] < 60
    assert not (tmp_path / "sweep" / "1_seed=1").exists() and not (tmp_path / "sweep" / "report.json").exists()

    # a guard against a hang, not a speed test: two 300-step jobs once took over 300 s on 2
    # cores shared with a test suite, two trainings and another pytest
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert again.returncode == 0, again.stderr
    assert f"at step {first['steps']}" in again.stdout  # job 0 resumed where it stopped
    for job in ("0_seed=0", "1_seed=1"):
        summary = json.loads((tmp_path / "sweep" / job / "summary.json").read_text())
        assert summary["steps"] == 60 and summary["stopped_by"] is None
    report = json.loads((tmp_path / "sweep" / "report.json").read_text())
    assert [g["seeds"] for g in report["groups"]] == [2]


@pytest.mark.slow  # the fast tier kills re-saves at random moments (test_faults) and resumes (test_loop)
def test_kill_9_loses_only_the_steps_since_the_last_checkpoint(tmp_path):
    """SIGKILL at an arbitrary moment (perhaps inside a save): every checkpoint left behind
    loads whole, and the same command resumes from the latest one."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from llmlab.train.checkpoint import list_checkpoints, load_checkpoint
    from llmlab.train.recovery import completeness
    from tests.conftest import REPO, SAMPLE_TEXTS, seed_peak
    (tmp_path / "c.txt").write_text("".join(SAMPLE_TEXTS.values()) * 5)
    env = {**os.environ, "LLMLAB_CACHE": str(tmp_path / ".cache"), "PYTHONPATH": str(REPO)}
    seed_peak(tmp_path / ".cache")
    cmd = [sys.executable, "-m", "llmlab", "train", "data=text", f"data.paths={tmp_path}/c.txt", *TINY,
           "train.steps=100000", "train.ckpt_every=3", "train.keep_checkpoints=2", "train.eval_every=0",
           "train.log_every=1", "hydra.run.dir=run"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    root = tmp_path / "run" / "checkpoints"
    deadline = time.time() + 120
    while time.time() < deadline and len(list_checkpoints(root)) < 2:
        time.sleep(0.05)
    time.sleep(0.37)  # somewhere in a later step or save
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    found = list_checkpoints(root)
    assert len(found) >= 2
    for path in found:  # whatever is visible is complete
        ckpt = load_checkpoint(path)
        assert ckpt.trainer_state()["optimizer"]["state"]
    # A kill between a save's last write and its rename leaves a complete copy under a temporary
    # name; the next run puts it in place and resumes from it.
    pending = [int(re.search(r"step_(\d+)", p.name).group(1)) for p in root.iterdir()
               if p.name.startswith((".tmp-", ".old-")) and completeness(p, legacy=p.name.startswith(".old-")) is None]
    last = max([int(found[-1].name.split("_")[1]), *pending])
    logged = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if line.endswith("}")]
    assert max(logged) - last < 3 + 1  # at most the steps since the last checkpoint are lost

    again = subprocess.run([*cmd, f"train.max_steps={last + 2}"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"resumed from {root / f'step_{last:06d}'} at step {last}" in again.stdout
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, last + 3))  # the lost steps were trained again, each logged once
    assert not list(root.glob(".tmp-*"))  # a save cleans up what a killed save left
