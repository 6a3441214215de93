"""Knowledge distillation: the KL term, its weight, the teacher's windows, resume and errors."""

import json

import pytest
import torch
import torch.nn.functional as F

from llmlab.errors import ConfigError, UserError
from llmlab.train.distill import distill_kl
from llmlab.train.loop import run_training
from tests.conftest import write_corpus
from tests.helpers import config


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A small trained teacher (byte tokenizer, the loop tests' data), shared by the module."""
    tmp = tmp_path_factory.mktemp("teacher")
    run_training(config(write_corpus(tmp), tmp, steps=60, eval_every=0), tmp / "run")
    return tmp


def student(corpus_dir, tmp, teacher, **distill):
    cfg = config(corpus_dir, tmp, steps=30, log_every=1, eval_every=0)
    cfg["cache_dir"] = str(teacher / "cache")  # the teacher's prepared data: the same tokenizer
    cfg["model"] = {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}
    cfg["distill"] = {"teacher": str(teacher / "run"), **distill}
    return cfg


def test_kl_matches_a_direct_computation():
    torch.manual_seed(0)
    s, t = torch.randn(2, 5, 11), torch.randn(2, 5, 11)
    for tau in (1.0, 2.0):
        p = F.softmax(t / tau, -1)
        direct = (p * (p.log() - F.log_softmax(s / tau, -1))).sum(-1).mean() * tau ** 2
        assert float(distill_kl(s, t, tau)) == pytest.approx(float(direct), rel=1e-5)
    assert float(distill_kl(t, t, 1.0)) == pytest.approx(0.0, abs=1e-6)


def test_weight_zero_trains_exactly_like_no_teacher(corpus_dir, tmp_path, teacher):
    plain = student(corpus_dir, tmp_path, teacher)
    del plain["distill"]
    run_training(plain, tmp_path / "plain")
    run_training(student(corpus_dir, tmp_path, teacher, weight=0.0), tmp_path / "w0")
    a = [r["train/loss"] for r in records(tmp_path / "plain") if "train/loss" in r]
    b = [r["train/loss"] for r in records(tmp_path / "w0") if "train/loss" in r]
    assert a == b and len(a) == 30
    # the KL term is still measured and logged
    assert all(r["distill/kl"] > 0 for r in records(tmp_path / "w0") if "train/loss" in r)


def test_distillation_brings_the_student_to_the_teacher(corpus_dir, tmp_path, teacher):
    cfg = student(corpus_dir, tmp_path, teacher, data="teacher")
    cfg["train"]["eval_every"] = 1  # step 1 and the end: how far the student moved towards the teacher
    summary = run_training(cfg, tmp_path / "s")
    evals = [r for r in records(tmp_path / "s") if "val/teacher_agreement" in r]
    kls = [r["distill/kl"] for r in records(tmp_path / "s") if "distill/kl" in r]
    assert sum(kls[-5:]) < 0.5 * sum(kls[:5])
    assert evals[-1]["val/teacher_kl"] < 0.5 * evals[0]["val/teacher_kl"]
    assert evals[-1]["val/teacher_agreement"] > evals[0]["val/teacher_agreement"] + 0.1
    assert summary["teacher"] == str((teacher / "run" / "checkpoints" / "step_000060").resolve())
    assert summary["teacher_agreement"] == evals[-1]["val/teacher_agreement"]


def test_teacher_windows_are_the_teachers_greedy_text(teacher):
    from llmlab.sample.generate import SamplingConfig, generate
    from llmlab.train.checkpoint import build_model, load_checkpoint
    from llmlab.train.distill import DistillConfig, Distiller

    ckpt = load_checkpoint(teacher / "run")
    model = build_model(ckpt, torch.device("cpu"))
    d = Distiller(DistillConfig(teacher=str(teacher / "run"), data="teacher", prompt_tokens=5, gen_batch=5), model,
                  ckpt.tokenizer_path, torch.device("cpu"), seed=0)
    drawn = []

    def draw():
        drawn.append(torch.randint(0, 200, (3, 33)))
        return drawn[-1]
    amp = torch.autocast("cpu", enabled=False)
    first, second = d.next_window(draw, amp), d.next_window(draw, amp)
    assert len(drawn) == 2  # gen_batch=5 windows -> two batches of 3 written at once, handed out in order
    d.next_window(draw, amp)
    assert len(drawn) == 4
    out = torch.cat([first, second])
    window = torch.cat(drawn[:2])
    assert out.shape == window.shape and torch.equal(out[:, :5], window[:, :5])
    again = generate(model, window[:, :5], SamplingConfig(max_new_tokens=28, temperature=0.0))
    assert torch.equal(out, again)
    # and on its own text the teacher's next token is the arg-max everywhere after the prompt
    logits = model(out[:, :-1]).logits[..., :model.vocab_size]
    assert torch.equal(logits[:, 4:].argmax(-1), out[:, 5:])


def test_resume_with_sampled_teacher_windows_is_exact(corpus_dir, tmp_path, teacher):
    def cfg(**train):
        c = student(corpus_dir, tmp_path, teacher, data="teacher", gen_temperature=1.0)
        c["distill"]["gen_batch"] = 20  # a pool of windows outlives the checkpoint at step 5
        c["train"].update(steps=12, ckpt_every=5, keep_checkpoints=5, **train)
        return c

    run_training(cfg(), tmp_path / "straight")
    run_training(cfg(resume=str(tmp_path / "straight" / "checkpoints" / "step_000005")), tmp_path / "resumed")

    def losses(run):
        return {r["step"]: (r["train/loss"], r["distill/kl"]) for r in records(tmp_path / run) if "train/loss" in r}
    straight, resumed = losses("straight"), losses("resumed")
    assert [resumed[s] for s in range(6, 13)] == [straight[s] for s in range(6, 13)]


def test_bad_distill_settings_name_their_key(corpus_dir, tmp_path, teacher):
    with pytest.raises(ConfigError, match=r"distill\.data: unknown 'gen'; allowed: corpus, teacher"):
        run_training(student(corpus_dir, tmp_path, teacher, data="gen"), tmp_path / "a")
    with pytest.raises(ConfigError, match=r"distill\.weight: must be in \[0, 1\]"):
        run_training(student(corpus_dir, tmp_path, teacher, weight=1.5), tmp_path / "b")
    missing = student(corpus_dir, tmp_path, teacher)
    missing["distill"]["teacher"] = str(tmp_path / "nowhere")
    with pytest.raises(UserError, match=r"^distill\.teacher: .*nowhere does not exist"):
        run_training(missing, tmp_path / "c")
    # another tokenizer: a BPE student against the byte-level teacher
    other = student(corpus_dir, tmp_path, teacher)
    other["tokenizer"] = {"kind": "bpe", "vocab_size": 300}
    other["cache_dir"] = str(tmp_path / "cache2")
    with pytest.raises(ConfigError, match=r"distill\.teacher: .* uses another tokenizer"):
        run_training(other, tmp_path / "d")
