"""Held-out loss by position against a direct computation."""

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from llmlab.eval.loss import evaluate_loss
from tests.conftest import tiny_model


def test_per_position_loss_matches_a_direct_computation():
    model = tiny_model()
    tokens = np.random.default_rng(0).integers(0, 97, 16 * 6 + 1)
    res = evaluate_loss(model, tokens, 16, 4, torch.device("cpu"), contextlib.nullcontext())
    windows = torch.from_numpy(tokens[:96 + 1]).long()
    x = torch.stack([windows[i * 16:(i + 1) * 16] for i in range(6)])
    y = torch.stack([windows[i * 16 + 1:(i + 1) * 16 + 1] for i in range(6)])
    with torch.no_grad():
        nll = F.cross_entropy(model(x).logits.transpose(1, 2), y, reduction="none")  # (6, 16)
    pp = res["per_position"]
    assert pp["tokens"] == [6] * 16
    assert np.allclose(pp["loss"], nll.mean(0).numpy(), atol=1e-5)
    assert abs(res["loss"] - float(nll.mean())) < 1e-5


def test_max_windows_spreads_over_the_split():
    model = tiny_model()
    tokens = np.random.default_rng(0).integers(0, 97, 16 * 10 + 1)
    res = evaluate_loss(model, tokens, 16, 2, torch.device("cpu"), contextlib.nullcontext(), max_windows=4)
    assert res["windows"] == 4 and res["tokens"] == 4 * 16
