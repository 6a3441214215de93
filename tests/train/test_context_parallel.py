"""Context parallel training (``train.context_parallel``) under torchrun, on the CPU with gloo:
ranks that share each sequence through ring attention follow the one-process loss curve, alone
and beside data parallelism, across a resume (in the slow tier: tests/train/test_distributed.py
runs 2 ranks sharing each sequence in every `make test`); what it cannot split is one line
naming the key."""

import json
from pathlib import Path

import pytest

from tests.conftest import check_cli, run_cli
from tests.train import test_distributed as distributed
from tests.helpers import losses

STEPS = 20


def common(tmp_path: Path) -> list[str]:
    return [*distributed.common(tmp_path, steps=STEPS, heads=4), "train.head_loss=plain"]


KINDS = {"mha": ["model/attention=mha"], "gqa": ["model/attention=gqa"],
         "mla": ["model/attention=mla", "attention.kv_rank=16", "attention.rope_dim=4", "attention.nope_dim=8",
                 "attention.v_dim=8"]}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The one-process loss curve of a kind (batch 4), run once per kind this module asks for."""
    curves = {}

    def curve(kind: str) -> dict[int, float]:
        if kind not in curves:
            tmp = tmp_path_factory.mktemp(f"one-{kind}")
            r = run_cli("train", *common(tmp), *KINDS[kind], "train.batch_size=4", "hydra.run.dir=run",
                        process=True, cwd=tmp)
            assert r.returncode == 0, r.stderr[-2000:]
            curves[kind] = losses(tmp / "run")
        return curves[kind]
    return curve


def run_and_resume(ranks: int, args: list[str], tmp_path: Path) -> tuple[str, dict[int, float]]:
    """The run stopped at step 10 (train.max_steps), then the same command resumes it to the end."""
    first = distributed.torchrun(*args, "train.max_steps=10", cwd=tmp_path, ranks=ranks)
    assert first.returncode == 0, first.stderr[-3000:]
    second = distributed.torchrun(*args, cwd=tmp_path, ranks=ranks)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout and "at step 10" in second.stdout
    got = losses(tmp_path / "run")
    assert sorted(got) == list(range(1, STEPS + 1))
    return first.stdout, got


@pytest.mark.slow
def test_context_and_data_parallel_follow_the_one_process_curve_across_a_resume(one_process, tmp_path):
    """4 ranks: two groups of two share each sequence (16 of the 32 positions each), and the
    groups split the batch (2 + 2 windows). The loss at each of 20 steps agrees with one
    process's (4 windows) within 1e-5, across a resume at step 10."""
    reference = one_process("mha")
    args = [*common(tmp_path), *KINDS["mha"], "train.batch_size=2", "train.context_parallel=2", "hydra.run.dir=run"]
    stdout, got = run_and_resume(4, args, tmp_path)
    assert "4 ranks, DDP, each sequence split across 2 of them (ring attention, 16 positions each)" in stdout
    for step in range(1, STEPS + 1):
        assert got[step] == pytest.approx(reference[step], abs=1e-5), step
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["context_parallel"] == 2 and summary["world_size"] == 4 and summary["tokens"] == STEPS * 4 * 32


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_two_ranks_sharing_each_sequence_follow_the_one_process_curve_across_a_resume(one_process, kind, tmp_path):
    """2 ranks, each holding 16 of the 32 positions of all 4 windows, for each kind of the GQA
    family and MLA: the one-process curve within 1e-5 over 20 steps, across a resume."""
    reference = one_process(kind)
    args = [*common(tmp_path), *KINDS[kind], "train.batch_size=4", "train.context_parallel=2", "hydra.run.dir=run"]
    _, got = run_and_resume(2, args, tmp_path)
    for step in range(1, STEPS + 1):
        assert got[step] == pytest.approx(reference[step], abs=1e-5), step


@pytest.mark.parametrize("args, message", [
    (["model.max_seq_len=30"], "train.context_parallel: model.max_seq_len=30 is not divisible by 4 ranks"),
    (["model/attention=swa"], "train.context_parallel: model/attention=swa cannot split its sequence across ranks; "
                              "allowed: gqa, mha, mla, mqa, qknorm"),
    (["model/attention=dsa"], "model/attention=dsa cannot split"),
    (["pos=alibi"], "cannot be combined with pos=alibi"),
    (["train.fsdp=true"], "cannot be combined with train.fsdp"),
])
def test_what_it_cannot_split_is_one_line(args, message, tmp_path):
    r = check_cli("train", "train.context_parallel=4", *args, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_one_process_cannot_share_a_sequence(tmp_path):
    r = run_cli("train", *common(tmp_path), "train.context_parallel=2", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("llmlab: error: train.context_parallel: 2 ranks share each sequence, so the ranks "
                                "must be a multiple of 2; it runs in one process; start 2 (or a multiple) with "
                                "torchrun --nproc_per_node=2")


def test_one_process_with_fsdp_says_nothing_is_sharded(tmp_path):
    """train.fsdp=true without torchrun trains as one process would, and says so (it was silent)."""
    r = run_cli("train", *common(tmp_path), "train.fsdp=true", "train.steps=1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert ("train.fsdp: one process holds the whole model, so nothing is sharded; start several with torchrun "
            "--nproc_per_node=N to shard it") in r.stdout
