"""Training under torchrun, on the CPU with gloo: two processes follow the one-process loss
curve through resumes, each with half the batch (DDP, FSDP2) or with half of every sequence
(train.context_parallel=2, ring attention), each stage resuming from the one before."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli, seed_peak
from tests.helpers import losses

STEPS = 10


def common(tmp_path: Path, steps: int = STEPS, heads: int = 2) -> list[str]:
    """A small byte-level run on a corpus written into ``tmp_path``."""
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        words = "the quick brown fox jumps over a lazy dog then runs from the big red barn".split()
        corpus.write_text("\n".join(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(11))
                                    for i in range(2000)))
    return ["logger=none", "data=text", f"data.paths=[{corpus}]", "tokenizer=byte", "model.d_model=32",
            "model.n_layers=2", f"model.n_heads={heads}", "model.max_seq_len=32", f"train.steps={steps}",
            "train.log_every=1", "train.eval_windows=4", "train.sample_tokens=4", "train.ckpt_every=0", "seed=0",
            "optim=adamw"]  # FSDP's stage takes AdamW: optim=muon (the default) with FSDP is refused


def torchrun(*args: str, cwd: Path, ranks: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "LLMLAB_CACHE": str(cwd / ".cache"), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    seed_peak(cwd / ".cache")
    env.pop("WANDB_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone",
                           "-m", "llmlab", "train", *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=env)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[int, float]:
    tmp = tmp_path_factory.mktemp("one")
    r = run_cli("train", *common(tmp), "train.batch_size=4", "train.head_loss=plain", "hydra.run.dir=run", cwd=tmp)
    assert r.returncode == 0, r.stderr[-2000:]
    return losses(tmp / "run")


# How the two ranks share the one process's batch of 4 windows of 32 positions, and the step
# each stage stops at (train.max_steps): each stage resumes from the checkpoint the one before
# it wrote, in another way of splitting the work. train.fsdp and train.context_parallel are not
# part of the run id, the batch per rank is: the last stage names the checkpoint it continues.
STAGES = [
    ("ddp", ["train.batch_size=2"], 3),  # 2 windows each
    ("fsdp", ["train.batch_size=2", "train.fsdp=true"], 6),  # 2 windows each, parameters sharded
    ("context", ["train.batch_size=4", "train.context_parallel=2", "train.resume=run/checkpoints/step_000006"],
     STEPS),  # all 4 windows, 16 positions each
]


def follow_the_stages(stages: list, one_process: dict[int, float], tmp_path: Path) -> subprocess.CompletedProcess:
    """Run ``stages`` in turn, each resuming from the last; at each, the losses so far agree
    with one process's within 1e-5. The last stage's result."""
    # the ranks use the fused head-and-loss (its gradients reach DDP's and FSDP's hooks from a
    # custom autograd function); the one process the plain head
    base = [*common(tmp_path), "train.head_loss=fused", "hydra.run.dir=run"]
    stopped_at = 0
    for parallel, split, stop in stages:
        args = [*base, *split, *([f"train.max_steps={stop}"] if stop < STEPS else [])]
        r = torchrun(*args, cwd=tmp_path)
        assert r.returncode == 0, (parallel, r.stderr[-3000:])
        if stopped_at:
            assert "resumed from" in r.stdout and f"at step {stopped_at}" in r.stdout, (parallel, r.stdout)
        if stop < STEPS:
            assert f"stopped by train.max_steps={stop}" in r.stdout, (parallel, r.stdout)
        if parallel == "context":
            assert "2 ranks, DDP, each sequence split across 2 of them (ring attention, 16 positions each)" in r.stdout
        if parallel == "fsdp":
            assert "2 ranks, FSDP2" in r.stdout, r.stdout
        stopped_at = stop
        got = losses(tmp_path / "run")
        assert sorted(got) == list(range(1, stop + 1)), parallel  # a resumed run's records replace nothing twice
        for step in range(1, stop + 1):
            assert got[step] == pytest.approx(one_process[step], abs=1e-5), (parallel, step)
    # only rank 0 writes: one run directory, one log line per step, nothing else in outputs/
    assert not (tmp_path / "outputs").exists()
    return r


def test_two_ranks_follow_the_one_process_curve_through_ddp_then_fsdp(one_process, tmp_path):
    """Same global batch: the loss at each step agrees with one process's within 1e-5, though
    the ranks fuse the head and loss and the one process does not. DDP runs steps 1-3 and
    saves; FSDP2 loads that checkpoint into sharded parameters and runs 4-6. (The slow tier
    goes on with ring attention and the finished run.)"""
    follow_the_stages(STAGES[:2], one_process, tmp_path)


@pytest.mark.slow
def test_two_ranks_follow_the_one_process_curve_through_ddp_fsdp_and_context_parallel(one_process, tmp_path):
    """As above, then two ranks sharing each sequence (ring attention) load FSDP's checkpoint
    and finish; the finished run is then not trained again."""
    r = follow_the_stages(STAGES, one_process, tmp_path)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["parallel"] == "ddp" and summary["context_parallel"] == 2
    assert summary["steps"] == STEPS and summary["tokens"] == STEPS * 4 * 32
    assert r.stdout.count("done: ") == 1
    got = losses(tmp_path / "run")

    # a finished run is not trained again (the run directory holds the last stage's config now)
    base = [*common(tmp_path), "train.head_loss=fused", "hydra.run.dir=run"]
    again = torchrun(*base, "train.batch_size=4", "train.context_parallel=2", cwd=tmp_path)
    assert again.returncode == 0 and "finished already" in again.stdout, again.stdout + again.stderr[-3000:]
    assert losses(tmp_path / "run") == got


@pytest.mark.parametrize("code,status", [(None, 0), (0, 0), (2, 2), ("llmlab: error: bad", 1)])
def test_a_worker_leaves_as_a_normal_exit_would_without_finalizing(tmp_path, code, status):
    """A torchrun worker ends without interpreter finalization (where gloo's threads can abort
    the process), yet everything a normal exit does still happens: the exit handlers run,
    buffered output reaches the pipe, and the status is the command's."""
    marker = tmp_path / "handler_ran"
    script = ("import atexit, sys\n"
              f"atexit.register(lambda: open({str(marker)!r}, 'w').write('yes'))\n"
              "sys.stdout.write('buffered line, no newline flush')\n"
              "from llmlab.cli import leave_without_finalizing\n"
              f"leave_without_finalizing({code!r})\n"
              "print('never reached')\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == status
    assert r.stdout == "buffered line, no newline flush"
    assert marker.read_text() == "yes"
    assert r.stderr == (f"{code}\n" if isinstance(code, str) else "")
