"""The levers against logit growth and loss spikes: Gemma 2's logit soft-cap
(``model.logit_softcap``), PaLM's z-loss (``train.z_loss``) and the loss-spike line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llmlab.model.transformer import lean_decoding
from llmlab.train.card import spike
from tests.conftest import tiny_model
from tests.helpers import incremental_logits


def test_the_cap_bounds_every_logit_as_tanh_does_and_decoding_sees_the_same_cap():
    raw = tiny_model(init_std=1.0)  # large weights: logits past the cap
    capped = tiny_model(init_std=1.0, logit_softcap=5.0)
    x = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        plain, out = raw(x).logits, capped(x).logits
        assert plain.abs().max() > 10 and out.abs().max() < 5.0
        assert torch.allclose(out, 5.0 * torch.tanh(plain / 5.0), atol=1e-5)
        # decoding through the cache, and its lean path, cap what they compute the same way
        cuts = list(range(3, 12))
        stepped = 5.0 * torch.tanh(incremental_logits(raw, x, cuts) / 5.0)
        assert torch.allclose(incremental_logits(capped, x, cuts), stepped, atol=1e-5)
        with lean_decoding(capped), lean_decoding(raw):
            assert torch.allclose(incremental_logits(capped, x, cuts), 5.0 * torch.tanh(incremental_logits(raw, x, cuts) / 5.0),
                                  atol=1e-5)
    # the training loss is the cross-entropy of the capped logits, whichever head_loss is asked
    y = torch.randint(0, 97, (2, 12))
    for head_loss in ("auto", "fused"):
        loss = capped(x, y, logits=False, head_loss=head_loss).loss
        assert torch.allclose(loss, F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)), atol=1e-5)


def test_the_z_loss_adds_its_coefficient_times_the_mean_squared_log_normaliser():
    model = tiny_model(init_std=0.5)
    x, y = torch.randint(0, 97, (2, 12)), torch.randint(0, 97, (2, 12))
    y[0, :4] = -100  # targets that do not count do not count in the z-loss either
    plain = model(x, y)
    out = model(x, y, logits=False, head_loss="fused", z_loss=1e-2)
    lse = torch.logsumexp(plain.logits.float(), dim=-1)[y != -100]
    assert torch.allclose(out.metrics["train/z_loss"], 1e-2 * lse.square().mean(), rtol=1e-5)
    assert torch.allclose(out.loss, plain.loss + 1e-2 * lse.square().mean(), rtol=1e-5)
    # its gradient pulls the normaliser towards 1: a step on the z-loss alone lowers it
    model.zero_grad()
    (out.loss - out.main_loss).backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.5 * p.grad
        after = torch.logsumexp(model(x).logits.float(), dim=-1)[y != -100]
    assert after.square().mean() < lse.square().mean()


def test_a_spike_is_well_above_the_recent_losses_and_a_falling_loss_is_none():
    falling = [6.0 - 0.2 * i for i in range(20)]
    assert all(spike(falling[:i], x) is None for i, x in enumerate(falling))
    steady = [3.0, 3.02, 2.99, 3.01, 3.0, 2.98, 3.01]
    assert spike(steady, 3.5) == pytest.approx(3.0) and spike(steady, 3.05) is None
    assert spike(steady[:4], 9.0) is None  # too few to judge


@pytest.mark.parametrize("overrides, key", [(("train.z_loss=1e-4",), "train.z_loss=0.0001"),
                                            (("model.logit_softcap=30",), "model.logit_softcap=30")])
def test_the_fused_head_loss_is_refused_beside_what_reads_the_logits(overrides, key):
    from llmlab.errors import ConfigError
    from tests.helpers import job_of

    with pytest.raises(ConfigError, match=rf"^train.head_loss: fused never holds the logits, which {key}"):
        job_of("train.head_loss=fused", *overrides)
    job_of("train.head_loss=auto", *overrides)


def test_export_refuses_a_capped_model_in_one_line():
    from llmlab.errors import UserError
    from llmlab.export.hf import pick_family

    model = tiny_model(logit_softcap=30.0)
    with pytest.raises(UserError, match=r"^export: transformers' llama, qwen3, gpt2 have no logit soft-cap.*=30\)$"):
        pick_family(model.spec, model)
