"""Activation checkpointing (``train.activation_checkpointing``): the same numbers as keeping
every activation, with fewer activations kept."""

from __future__ import annotations

import json

import pytest
import torch

from llmlab.model.attention import ATTENTION
from tests.conftest import tiny_model

MODES = ("none", "full", "selective")
ATTN = {"gqa": {"kind": "gqa", "kv_heads": 2}, "swa": {"kind": "swa", "window": 5}}


def steps(mode: str, **kwargs) -> tuple[list[float], list[torch.Tensor], int]:
    """Three AdamW steps of a tiny model checkpointing as ``mode``: the losses, the last
    gradients and the bytes autograd kept for the first backward."""
    model = tiny_model(**kwargs).train()
    model.checkpointing = mode
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    losses, kept = [], 0

    def pack(t):
        nonlocal kept
        kept += t.numel() * t.element_size()
        return t
    for i in range(3):
        x = torch.randint(0, 97, (4, 25), generator=g)
        if i == 0:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = model(x[:, :-1], x[:, 1:]).loss
        else:
            loss = model(x[:, :-1], x[:, 1:]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.grad.clone() for p in model.parameters() if p.grad is not None], kept


@pytest.mark.parametrize("attn", ATTENTION.names())
def test_checkpointing_trains_bit_for_bit_as_keeping_everything(attn):
    ref_losses, ref_grads, _ = steps("none", attention=ATTN.get(attn, {"kind": attn}))
    for mode in MODES[1:]:
        losses, grads, _ = steps(mode, attention=ATTN.get(attn, {"kind": attn}))
        assert losses == ref_losses, (attn, mode)
        assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads)), (attn, mode)


def test_checkpointing_keeps_only_each_blocks_input_for_the_backward():
    """What the saved-tensor hooks see: full keeps each block's input; selective adds the
    matmul outputs it keeps, where torch routes them through the hooks (2.14 on; older
    releases hold them out of the hooks' sight: bench.activation_checkpointing measures them)."""
    from llmlab.model.transformer import _SAC_HOOKS
    kept = {mode: steps(mode, ffn="moe")[2] for mode in MODES}
    assert kept["full"] < kept["none"] / 5, kept
    if _SAC_HOOKS:
        assert kept["full"] < kept["selective"] < kept["none"], kept
    else:
        assert kept["selective"] == kept["full"], kept
    losses = {mode: steps(mode, ffn="moe")[0] for mode in MODES}  # the MoE's balance loss recomputed as well
    assert losses["full"] == losses["selective"] == losses["none"]


def test_a_run_with_full_checkpointing_logs_the_losses_of_one_without(corpus_dir, tmp_path):
    from llmlab.train.loop import run_training
    from tests.helpers import config

    curves = {}
    for mode in ("none", "full"):
        run_training(config(corpus_dir, tmp_path, steps=10, eval_every=0, activation_checkpointing=mode),
                     tmp_path / mode)
        records = [json.loads(line) for line in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()]
        curves[mode] = [r["train/loss"] for r in records if "train/loss" in r]
    assert len(curves["none"]) == 2 and curves["full"] == pytest.approx(curves["none"], abs=1e-6)


def test_checkpointing_is_refused_beside_the_ring():
    from llmlab.errors import ConfigError
    from tests.helpers import job_of

    with pytest.raises(ConfigError, match=r"^train.context_parallel: 2 cannot be combined with "
                                          r"train.activation_checkpointing=full"):
        job_of("train.context_parallel=2", "train.activation_checkpointing=full", "model/attention=mha")
