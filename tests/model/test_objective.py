import pytest
import torch

from llmlab.model.objective import IGNORE, OBJECTIVE
from tests.conftest import tiny_model


def mlm():
    return OBJECTIVE.build(OBJECTIVE.config({"kind": "mlm"}, "objective"))


def test_mlm_masking_rates_on_a_large_sample():
    window = torch.randint(0, 1000, (64, 1025))
    tokens = window[:, :-1]
    inputs, targets = mlm().make_batch(window, 1000, torch.Generator().manual_seed(0))
    chosen = targets != IGNORE
    n = tokens.numel()
    assert chosen.float().mean().item() == pytest.approx(0.15, abs=0.005)
    assert torch.equal(targets[chosen], tokens[chosen])  # loss only on chosen, against the original
    masked = (inputs == 1000) & chosen
    kept = (inputs == tokens) & chosen
    random = chosen & ~masked & ~kept
    k = chosen.sum().item()
    assert masked.sum().item() / k == pytest.approx(0.8, abs=0.01)
    assert random.sum().item() / k == pytest.approx(0.1, abs=0.01)  # random ids can equal the original
    assert kept.sum().item() / k == pytest.approx(0.1 + 0.1 / 1000, abs=0.01)
    assert torch.equal(inputs[~chosen], tokens[~chosen])
    assert n == 64 * 1024


def test_clm_targets_are_inputs_shifted():
    clm = OBJECTIVE.build(OBJECTIVE.config({"kind": "clm"}, "objective"))
    w = torch.arange(10)[None]
    x, y = clm.make_batch(w, 100)
    assert torch.equal(x, w[:, :-1]) and torch.equal(y, w[:, 1:])


def test_mlm_model_is_bidirectional_and_has_a_mask_token():
    model = tiny_model(vocab_size=128)
    bert = tiny_model(vocab_size=128, objective={"kind": "mlm"})
    # [MASK] is id vocab_size: one more row, padded to a multiple of 64
    assert bert.objective.extra_tokens() == 1 and bert.padded_vocab == 192
    assert model.objective.extra_tokens() == 0 and model.padded_vocab == 128
    x = torch.randint(0, 128, (1, 12))
    x2 = x.clone()
    x2[0, 8] = (x2[0, 8] + 1) % 128
    with torch.no_grad():
        a, b = bert(x).logits, bert(x2).logits
    assert not torch.allclose(a[:, :8], b[:, :8])  # earlier positions see the later token


def test_mlm_loss_only_counts_chosen_tokens():
    bert = tiny_model(objective={"kind": "mlm"}).eval()
    x = torch.randint(0, 97, (2, 10))
    targets = torch.full_like(x, IGNORE)
    targets[0, 3] = x[0, 3]
    out = bert(x, targets)
    logp = out.logits[0, 3].float().log_softmax(-1)
    assert torch.allclose(out.loss, -logp[x[0, 3]], atol=1e-5)
