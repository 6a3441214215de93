"""Faults a run meets outside its own code: kill -9 during a save and a re-save, a full disk,
a file-size limit, a read-only directory, two trainers on one run directory, leftovers of dead
writers. Each test asserts what was kept and what was printed."""

from __future__ import annotations

import errno
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from llmlab.errors import UserError
from llmlab.train.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from llmlab.train.recovery import completeness, recover_checkpoints
from tests.conftest import REPO, SAMPLE_TEXTS, run_cli, tiny_model
from tests.helpers import TINY, one_line_error

# A process that imports torch once, then for each line on stdin forks a child that saves step
# 60 once, then re-saves it over and over with new weights; the test kills that child with
# SIGKILL at random moments, so some kills land inside a replacement. (A fresh interpreter per
# kill cost 3 to 5 s of torch's import each.)
RESAVER = """
import os, sys, torch
from pathlib import Path
torch.set_num_threads(1)  # no thread pool to carry across the forks
from llmlab.data.tokenizer import TOKENIZER
from llmlab.train.checkpoint import save_checkpoint
from tests.conftest import tiny_model
root = Path(sys.argv[1])
tok = TOKENIZER.build(TOKENIZER.config({"kind": "byte"}, "tokenizer")).make()
tok.save(root / "tok.json")
model = tiny_model(seed=0, vocab_size=tok.vocab_size)
# an optimizer's state in the shape AdamW's takes (building one would import torch._dynamo)
opt = {"state": {i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
                 for i, p in enumerate(model.parameters())},
       "param_groups": [{"lr": 1e-3, "params": list(range(len(list(model.parameters()))))}]}
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        i = 0
        while True:
            with torch.no_grad():
                model.embed.weight.fill_(float(i))
            save_checkpoint(root / "checkpoints", 60, model, model.spec.to_dict(), {"seed": 0}, root / "tok.json",
                            state={"round": i}, trainer_state={"optimizer": opt})
            if i == 0:
                print(f"first {os.getpid()}", flush=True)
            i += 1
    os.waitpid(pid, 0)
    print("reaped", flush=True)
"""


def test_kill_9_during_resaves_always_leaves_a_complete_step(tmp_path):
    """Whatever instant a kill -9 hits a re-save of an existing step, the next run's recovery
    finds that step complete and loadable, with the old weights or the new."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(0)
    rounds = set()
    forker = subprocess.Popen([sys.executable, "-c", RESAVER, str(tmp_path)], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for trial in range(8):  # delays up to 0.6 s: on a loaded machine one save can take a good part of 0.3 s
            forker.stdin.write("go\n")
            forker.stdin.flush()
            first = forker.stdout.readline().split()
            assert first[:1] == ["first"], forker.stderr.read() if forker.poll() is not None else first
            time.sleep(rng.uniform(0.0, 0.6))
            os.kill(int(first[1]), signal.SIGKILL)
            assert forker.stdout.readline().strip() == "reaped"  # the child is gone: nothing writes now
            root = tmp_path / "checkpoints"
            recover_checkpoints(root)
            assert [p.name for p in list_checkpoints(root)] == ["step_000060"], sorted(os.listdir(root))
            assert sorted(p.name for p in root.iterdir()) == ["step_000060"]  # no leftovers either
            ckpt = load_checkpoint(root / "step_000060")
            assert ckpt.weights["embed.weight"].unique().tolist() == [float(ckpt.state["round"])]
            rounds.add(ckpt.state["round"])
    finally:
        forker.kill()
        forker.communicate(timeout=60)
    assert len(rounds) > 1  # the kills hit different saves


@pytest.fixture
def tokenizer_file(tmp_path) -> Path:
    from llmlab.data.tokenizer import TOKENIZER
    tok = TOKENIZER.build(TOKENIZER.config({"kind": "byte"}, "tokenizer")).make()
    tok.save(tmp_path / "tok.json")
    return tmp_path / "tok.json"


def save(root: Path, step: int, tokenizer_file: Path, seed: int = 0, **kwargs) -> Path:
    model = tiny_model(seed=seed, vocab_size=257)
    return save_checkpoint(root, step, model, model.spec.to_dict(), {"seed": 0}, tokenizer_file,
                           state={"step_seen": step}, trainer_state={"x": torch.zeros(3)}, **kwargs)


@pytest.mark.parametrize("moment", ["after the old copy moved aside", "before the manifest"])
def test_a_resave_killed_at_each_moment_is_recovered(tmp_path, tokenizer_file, monkeypatch, moment):
    """The two instants that matter, hit exactly: between the two renames of a replacement
    (the old copy aside, the new one not yet in: the new one is restored), and before the
    manifest is written (the new copy is incomplete: the old one stays)."""
    root = tmp_path / "checkpoints"
    save(root, 60, tokenizer_file)
    old_weights = load_checkpoint(root / "step_000060").weights["embed.weight"].clone()

    class Killed(BaseException):  # stands for SIGKILL: no cleanup runs
        pass

    import llmlab.train.checkpoint as ck
    if moment == "after the old copy moved aside":
        renames = []
        real = os.rename

        def rename(a, b):
            renames.append((a, b))
            if len(renames) == 2:
                raise Killed
            real(a, b)
        monkeypatch.setattr(ck.os, "rename", rename)
    else:
        real_dumps = json.dumps

        def dumps(obj, **kw):
            if isinstance(obj, dict) and "files" in obj:
                raise Killed
            return real_dumps(obj, **kw)
        monkeypatch.setattr(ck.json, "dumps", dumps)
    monkeypatch.setattr(ck.shutil, "rmtree", lambda *a, **k: None)  # a killed process cleans nothing
    with pytest.raises(Killed):
        save(root, 60, tokenizer_file, seed=1)
    monkeypatch.undo()
    if moment == "after the old copy moved aside":
        assert not (root / "step_000060").exists() and list_checkpoints(root) == []
    done = recover_checkpoints(root)
    assert done and [p.name for p in list_checkpoints(root)] == ["step_000060"]
    weights = load_checkpoint(root / "step_000060").weights["embed.weight"]
    assert torch.equal(weights, old_weights) == (moment == "before the manifest")


def test_a_save_killed_while_copying_its_last_file_is_not_restored(tmp_path, tokenizer_file):
    """Killed inside the tokenizer copy, a save's temporary directory holds every required
    name, the last one short, and no manifest: the next run must not take it for a
    checkpoint from before manifests, and resumes from the last complete one instead."""
    root = tmp_path / "checkpoints"
    first = save(root, 10, tokenizer_file)
    cut = root / ".tmp-deadhost-1-step_000020-x"
    shutil.copytree(first, cut)
    (cut / "manifest.json").unlink()
    (cut / "tokenizer.json").write_text("")
    done = recover_checkpoints(root)
    assert done == ["removed the leftover .tmp-deadhost-1-step_000020-x"]
    assert list_checkpoints(root) == [first]


def test_completeness_is_decided_by_the_manifest(tmp_path, tokenizer_file):
    path = save(tmp_path / "checkpoints", 10, tokenizer_file)
    assert completeness(path) is None
    (path / "tokenizer.json").unlink()
    assert completeness(path) == "missing tokenizer.json" and list_checkpoints(tmp_path / "checkpoints") == []
    with pytest.raises(UserError, match="not a complete checkpoint .missing tokenizer.json"):
        load_checkpoint(path)
    path = save(tmp_path / "checkpoints", 20, tokenizer_file)
    (path / "manifest.json").unlink()  # a save cut before its last file: every other file is there
    (path / "config.yaml").unlink()
    assert "missing config.yaml" in completeness(path)


def test_a_full_disk_while_saving_says_so_and_keeps_the_last_checkpoint(tmp_path, tokenizer_file, monkeypatch):
    root = tmp_path / "checkpoints"
    first = save(root, 10, tokenizer_file)
    import llmlab.train.checkpoint as ck

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(a[1]))
    monkeypatch.setattr(ck, "save_file", full)
    with pytest.raises(UserError) as e:
        save(root, 20, tokenizer_file)
    msg = str(e.value)
    assert "the device is full" in msg and f"the last complete checkpoint is {first}" in msg and "\n" not in msg
    assert list_checkpoints(root) == [first] and sorted(p.name for p in root.iterdir()) == ["step_000010"]


def tmpfs(path: Path, size: str) -> bool:
    """Mount a tmpfs of ``size`` at ``path``; False where this machine does not allow it."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


def corpus(tmp_path: Path) -> Path:
    (tmp_path / "c.txt").write_text("".join(SAMPLE_TEXTS.values()) * 2)
    return tmp_path / "c.txt"


def test_a_real_full_device_gives_one_line_and_a_failed_sweep_job(tmp_path):
    """A run directory on a device too small for a checkpoint: one line naming the problem and
    the file, no traceback. Inside a sweep the job gets its failed.txt and the report is still
    written. A real tmpfs where the machine allows one, else a file-size limit (RLIMIT_FSIZE:
    EFBIG on any file over it), which is a real fault too."""
    small = tmp_path / "small"
    mounted = tmpfs(small, "400k")
    # a file-size limit needs a process of its own; a small device serves this one as well
    limit = None if mounted else (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000)))
    try:
        data = ["data=text", f"data.paths=[{corpus(tmp_path)}]", *TINY, "train.steps=4", "train.eval_every=0"]
        # a model whose files (about 3 MB) cannot fit; one of d_model 16 (about 0.1 MB) can
        big = ["model.d_model=128"]
        r = run_cli("train", *data, *big, f"hydra.run.dir={small}/run", cwd=tmp_path, process=not mounted,
                    preexec_fn=limit)
        line = one_line_error(r, 1, "cannot write checkpoint", "the last complete checkpoint is none")
        assert ("the device is full" in line) if mounted else ("file-size limit" in line or "full" in line)
        assert not list((small / "run" / "checkpoints").glob(".tmp-*"))  # nothing half-written stays

        sweep = small / "sweep"
        r = run_cli("train", "-m", *data, "model.d_model=16,128", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
                    process=not mounted, preexec_fn=limit)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        (failed,) = sweep.glob("1_*/failed.txt")
        assert "cannot write checkpoint" in failed.read_text()
        assert len(list(sweep.glob("0_*/summary.json"))) == 1
        assert json.loads((sweep / "report.json").read_text())["unfinished"]
    finally:
        if mounted:
            subprocess.run(["umount", str(small)], check=False)


def test_a_read_only_directory_is_one_line(tmp_path):
    """A run directory and a cache on a read-only file system (a tmpfs remounted read-only
    where the machine allows it; else a path under /sys, which refuses new files)."""
    ro = tmp_path / "ro"
    mounted = tmpfs(ro, "1m") and subprocess.run(["mount", "-o", "remount,ro", str(ro)]).returncode == 0
    base = ro if mounted else Path("/sys/llmlab-test")
    try:
        data = ["data=text", f"data.paths=[{corpus(tmp_path)}]", *TINY, "train.steps=2"]
        r = run_cli("train", *data, f"cache_dir={base}/cache", cwd=tmp_path)
        one_line_error(r, 1, f"{base}/cache")
        r = run_cli("train", *data, f"hydra.run.dir={base}/run", cwd=tmp_path)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith("llmlab: error: "), r.stderr
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)], check=False)


def test_two_trainers_on_one_run_directory(tmp_path):
    """The second is refused in one line naming the holder's PID, and the holder's files are
    untouched (a save in progress is never cleaned away)."""
    from llmlab.files import RunLock
    run = tmp_path / "run"
    run.mkdir()
    inflight = run / "checkpoints" / ".tmp-x"  # another writer's save in progress
    inflight.mkdir(parents=True)
    lock = RunLock(run).acquire()
    try:
        r = run_cli("train", "data=text", f"data.paths=[{corpus(tmp_path)}]", *TINY, "train.steps=2",
                    f"hydra.run.dir={run}", process=True, cwd=tmp_path)
        one_line_error(r, 1, f"PID {os.getpid()}", str(run))
        assert inflight.is_dir()
    finally:
        lock.release()
    r = run_cli("train", "data=text", f"data.paths=[{corpus(tmp_path)}]", *TINY, "train.steps=2",
                f"hydra.run.dir={run}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not inflight.exists()  # the lock's holder is gone, so its leftovers are too


def _host() -> str:
    from llmlab.files import owned_name
    return owned_name("x").split("-")[1]


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_of_dead_writers_are_cleaned_and_live_ones_kept(tmp_path):
    from llmlab.data.prepare import prepare
    from llmlab.files import owned_name
    cache = tmp_path / "cache"
    cache.mkdir()
    mine = owned_name("x")  # .tmp-<host>-<this pid>-x-
    dead = cache / mine.replace(f"-{os.getpid()}-", f"-{dead_pid()}-")
    alive = cache / (mine + "y")
    other_host = cache / ".tmp-elsewhere-1-x-z"
    for d in (dead, alive, other_host):
        d.mkdir()
    prepare({"kind": "text", "paths": [str(corpus(tmp_path))]}, {"kind": "byte"}, str(cache), quiet=True)
    assert not dead.exists() and alive.is_dir() and other_host.is_dir()


def test_leftovers_are_never_followed_through_a_link_and_other_hosts_wait_for_the_lock(tmp_path):
    """A link with a leftover's name is neither followed nor reported as removed; a temporary
    of another host stays unless the run's lock is really held (on a shared file system its
    writer may be alive), and goes when it is."""
    root, elsewhere = tmp_path / "checkpoints", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep me")
    link = root / ".old-step_000010-x"
    link.symlink_to(elsewhere, target_is_directory=True)
    other_host = root / ".tmp-elsewhere-1-step_000003-a"
    other_host.mkdir()
    said = recover_checkpoints(root, locked=False)
    assert link.is_symlink() and (elsewhere / "precious.txt").read_text() == "keep me"
    assert other_host.is_dir()
    assert said == [f"left {link.name} alone: it is a symbolic link, not a directory llmlab wrote"]
    said = recover_checkpoints(root, locked=True)
    assert not other_host.exists() and f"removed the leftover {other_host.name}" in said
    assert link.is_symlink() and not any("removed" in line and link.name in line for line in said)


def test_resume_needs_trainer_state_or_says_weights_only(tmp_path):
    data = ["data=text", f"data.paths=[{corpus(tmp_path)}]", *TINY, "train.eval_every=0", "hydra.run.dir=run"]
    first = run_cli("train", *data, "train.steps=4", "train.max_steps=2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    # Another config in this directory is refused before anything in it is touched: a dead
    # writer's leftover and the run's records stay as they were.
    leftover = tmp_path / "run" / "checkpoints" / f".tmp-{_host()}-{dead_pid()}-step_000009-q"
    leftover.mkdir()
    metrics = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    other = run_cli("train", *data, "train.steps=4", "model.d_model=16", cwd=tmp_path)
    one_line_error(other, 2, "holds a run of another config", "hydra.run.dir")
    assert leftover.is_dir() and (tmp_path / "run" / "metrics.jsonl").read_bytes() == metrics
    leftover.rmdir()
    (ckpt,) = list_checkpoints(tmp_path / "run" / "checkpoints")
    (ckpt / "trainer.pt").unlink()
    manifest = json.loads((ckpt / "manifest.json").read_text())
    del manifest["files"]["trainer.pt"]
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    r = run_cli("train", *data, "train.steps=4", cwd=tmp_path)
    one_line_error(r, 1, "has no trainer.pt", "train.resume_weights_only=true")
    r = run_cli("train", *data, "train.steps=4", "train.resume_weights_only=true", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "fresh optimizer" in r.stdout and "at step 2" in r.stdout


def test_metrics_after_restarts_hold_each_step_once_and_full_interval_means(tmp_path):
    """A run stopped mid-interval (step 6 of a 4-step log interval) logs, at step 8, the
    mean over steps 5-8 as an uninterrupted run does; and a start that saved no checkpoint
    leaves no records to be logged twice."""
    def rows(run):
        return [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    data = ["data=text", f"data.paths=[{corpus(tmp_path)}]", *TINY, "train.log_every=4", "train.eval_every=0",
            "train.steps=12", "train.ckpt_every=0"]
    whole = run_cli("train", *data, "hydra.run.dir=whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "metrics.jsonl").write_text('{"step": 4, "train/loss": 9.0}\n')  # a start that saved nothing
    for extra in (["train.max_steps=6"], []):
        r = run_cli("train", *data, *extra, "hydra.run.dir=cut", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    got, want = rows("cut"), rows("whole")
    assert [r["step"] for r in got] == [r["step"] for r in want] == [4, 8, 12, 12]
    for a, b in zip(got, want):
        for key in ("train/loss", "train/grad_norm", "val/loss"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-6), (a["step"], key)
