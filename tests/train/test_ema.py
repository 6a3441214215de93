"""``train.ema``: a moving average of the weights, saved, resumed and scored beside them."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from llmlab.errors import UserError
from llmlab.train.ema import WeightAverage
from llmlab.train.loop import run_training
from tests.conftest import run_cli, tiny_model
from tests.helpers import config


def test_the_average_follows_its_update_rule_and_swaps_in_and_out():
    model = tiny_model(tie_embeddings=True)
    ema = WeightAverage(model, 0.9)
    assert "lm_head.weight" not in ema.shadow or "embed.weight" not in ema.shadow  # a tied tensor once
    start = {n: p.detach().clone() for n, p in ema.params.items()}
    trained = []
    for k in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * (k + 1))
        trained.append({n: p.detach().clone() for n, p in ema.params.items()})
        ema.update()
    for n in start:  # ema_k = 0.9 ema_{k-1} + 0.1 w_k, from the starting weights
        expect = start[n]
        for w in trained:
            expect = 0.9 * expect + 0.1 * w[n]
        assert torch.allclose(ema.shadow[n], expect, atol=1e-6)
    x = torch.randint(0, 97, (1, 8))
    raw = model(x).logits
    with ema.swapped_in():
        averaged = model(x).logits
    assert not torch.allclose(raw, averaged) and torch.equal(model(x).logits, raw)


def test_a_resumed_run_averages_exactly_as_an_uninterrupted_one(corpus_dir, tmp_path):
    whole = config(corpus_dir, tmp_path, steps=12, eval_every=6, ckpt_every=6, ema=0.8)
    run_training(whole, tmp_path / "whole")
    run_training({**whole, "train": {**whole["train"], "max_steps": 6}}, tmp_path / "split")
    run_training(whole, tmp_path / "split")  # resumes at step 6
    a = load_file(str(tmp_path / "whole" / "checkpoints" / "step_000012" / "ema.safetensors"))
    b = load_file(str(tmp_path / "split" / "checkpoints" / "step_000012" / "ema.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    raw = load_file(str(tmp_path / "whole" / "checkpoints" / "step_000012" / "model.safetensors"))
    assert raw.keys() == a.keys() and not all(torch.equal(raw[k], a[k]) for k in a)
    evals = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()
             if "val/loss" in line]
    assert all("val/loss_ema" in e and e["val/loss_ema"] != e["val/loss"] for e in evals)
    # eval, sample and export take the average with weights=ema
    scored = {}
    for weights in ("raw", "ema"):
        done = run_cli("eval", f"ckpt={tmp_path / 'whole'}", f"weights={weights}", f"text={tmp_path / 'mixed.txt'}",
                       f"hydra.run.dir={tmp_path / ('eval-' + weights)}", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        scored[weights] = json.loads((tmp_path / ("eval-" + weights) / "eval.json").read_text())
    assert scored["ema"]["weights"] == "ema" and scored["ema"]["loss"] != scored["raw"]["loss"]


def test_the_average_cannot_continue_from_a_checkpoint_without_one(corpus_dir, tmp_path):
    plain = config(corpus_dir, tmp_path, steps=6, eval_every=0, ckpt_every=6)
    run_training(plain, tmp_path / "plain")
    ckpt = tmp_path / "plain" / "checkpoints" / "step_000006"
    again = config(corpus_dir, tmp_path, steps=8, eval_every=0, ema=0.9, resume=str(ckpt))
    with pytest.raises(UserError, match=r"^train.ema: .* has no ema.safetensors \(it was saved without train.ema\)"):
        run_training(again, tmp_path / "other")
    done = run_cli("eval", f"ckpt={ckpt}", "weights=ema", cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.strip().startswith("llmlab: error: weights: ema, but")
