"""Training under torchrun, on the CPU with gloo: two processes follow the one-process loss
curve across a resume, each with half the batch (DDP, FSDP2) or with half of every sequence
(train.context_parallel=2, ring attention)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

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
            "train.log_every=1", "train.eval_windows=4", "train.sample_tokens=4", "train.ckpt_every=0", "seed=0"]


def torchrun(*args: str, cwd: Path, ranks: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "LLMLAB_CACHE": str(cwd / ".cache"), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("WANDB_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone",
                           "-m", "llmlab", "train", *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=env)


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[int, float]:
    tmp = tmp_path_factory.mktemp("one")
    r = run_cli("train", *common(tmp), "train.batch_size=4", "train.head_loss=plain", "hydra.run.dir=run", process=True, cwd=tmp)
    assert r.returncode == 0, r.stderr[-2000:]
    return losses(tmp / "run")


PARALLEL = {  # how the two ranks share the one process's batch of 4 windows of 32 positions
    "ddp": ["train.batch_size=2"],  # 2 windows each
    "fsdp": ["train.batch_size=2", "train.fsdp=true"],
    "context": ["train.batch_size=4", "train.context_parallel=2"],  # all 4 windows, 16 positions each (ring attention)
}


@pytest.mark.parametrize("parallel", list(PARALLEL))
def test_two_ranks_follow_the_one_process_curve_across_a_resume(one_process, tmp_path, parallel):
    """Same global batch: the loss at each of the first 10 steps agrees within 1e-5, though the
    ranks fuse the head and loss and the one process does not. The run stops at step 5
    (train.max_steps) and a second launch of the same command resumes it from its checkpoint."""
    # the ranks use the fused head-and-loss (its gradients reach DDP's and FSDP's hooks from a
    # custom autograd function); the one process the plain head
    fsdp = parallel == "fsdp"
    args = [*common(tmp_path), *PARALLEL[parallel], "train.head_loss=fused", "hydra.run.dir=run"]
    first = torchrun(*args, "train.max_steps=5", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "stopped by train.max_steps=5" in first.stdout
    if parallel == "context":
        assert "2 ranks, DDP, each sequence split across 2 of them (ring attention, 16 positions each)" in first.stdout
    second = torchrun(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout and "at step 5" in second.stdout

    got = losses(tmp_path / "run")
    assert sorted(got) == list(range(1, STEPS + 1))  # the resumed run's records replace nothing twice
    for step in range(1, STEPS + 1):
        assert got[step] == pytest.approx(one_process[step], abs=1e-5), step
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["parallel"] == ("fsdp" if fsdp else "ddp")
    assert summary["steps"] == STEPS and summary["tokens"] == STEPS * 4 * 32
    # only rank 0 writes: one run directory, one log line per step, nothing else in outputs/
    assert not (tmp_path / "outputs").exists()
    assert second.stdout.count("done: ") == 1

    assert summary["context_parallel"] == (2 if parallel == "context" else 1)
    if parallel == "ddp":  # once is enough: a finished run is not trained again
        third = torchrun(*args, cwd=tmp_path)
        assert third.returncode == 0 and "finished already" in third.stdout
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
