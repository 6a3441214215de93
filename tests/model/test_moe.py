import pytest
import torch

from llmlab.model.ffn import MoE, SwiGLU
from tests.conftest import tiny_model


def moe(n_experts=4, top_k=2, **kw) -> MoE:
    torch.manual_seed(0)
    return MoE(MoE.Config(hidden=32, n_experts=n_experts, top_k=top_k, **kw), 16, False)


def test_each_token_reaches_exactly_top_k_distinct_experts():
    layer = moe(n_experts=6, top_k=3)
    layer(torch.randn(2, 11, 16))
    routing = layer.last_routing
    assert routing.shape == (22, 3)
    assert all(len(set(row.tolist())) == 3 for row in routing)


def test_output_is_the_weighted_sum_of_the_chosen_experts():
    """The vectorised dispatch against a per-token reference computation."""
    layer = moe(n_experts=4, top_k=2).eval()
    x = torch.randn(9, 16)
    out = layer(x)
    probs = layer.router(x).softmax(-1)
    w, idx = probs.topk(2, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    for t in range(9):
        expect = sum(w[t, j] * layer.experts[int(idx[t, j])](x[t]) for j in range(2))
        assert torch.allclose(out[t], expect, atol=1e-5)


def test_one_expert_top_1_is_a_plain_ffn():
    layer = moe(n_experts=1, top_k=1)
    plain = SwiGLU(SwiGLU.Config(hidden=32), 16, False)
    plain.load_state_dict(layer.experts[0].state_dict())
    x = torch.randn(3, 5, 16)
    assert torch.allclose(layer(x), plain(x), atol=1e-6)


def test_balance_loss_is_lowest_for_a_uniform_router():
    layer = moe(n_experts=4, top_k=1)
    x = torch.randn(64, 16)
    with torch.no_grad():
        layer.router.weight.zero_()  # every expert equally likely
        layer(x)
        uniform = layer.take_aux()["balance_loss"].item()
        layer.router.weight.normal_()
        layer(x)
        random = layer.take_aux()["balance_loss"].item()
        layer.router.weight.zero_()
        layer.router.weight[0] = 5 * x.mean(0) / x.mean(0).norm()  # everything prefers expert 0
        layer.router.weight[0] *= 100
        layer(x.abs() + 1)
        collapsed = layer.take_aux()["balance_loss"].item()
    assert uniform == pytest.approx(1.0, abs=1e-6)  # E * sum f_i / E
    assert random >= uniform - 1e-6
    assert collapsed > 3.5  # about E = 4 when one expert takes every token


def test_shared_experts_always_contribute():
    layer = moe(n_experts=2, top_k=1, shared_experts=1)
    x = torch.randn(4, 16)
    routed_only = moe(n_experts=2, top_k=1)
    routed_only.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("shared")})
    assert torch.allclose(layer(x), routed_only(x) + layer.shared[0](x), atol=1e-6)


def test_router_jitter_only_in_training():
    layer = moe(jitter=0.5)
    x = torch.randn(32, 16)
    layer.eval()
    assert torch.equal(layer(x), layer(x))
    layer.train()
    torch.manual_seed(1)
    a = layer(x)
    torch.manual_seed(2)
    assert not torch.equal(a, layer(x))


def test_model_adds_the_weighted_balance_loss_and_logs_utilisation():
    model = tiny_model(ffn={"kind": "moe", "n_experts": 4, "top_k": 2, "balance_coef": 0.1}).train()
    x = torch.randint(0, 97, (2, 16))
    out = model(x, x)
    assert {"moe/balance_loss", "moe/load_max", "moe/load_min"} <= set(out.metrics)
    # each of the 2 MoE layers adds coef * its balance loss; the logged value is their mean
    assert torch.allclose(out.loss, out.metrics["loss/main"] + 2 * 0.1 * out.metrics["moe/balance_loss"], atol=1e-6)
    counts = model.param_counts()
    assert counts["active"] < counts["total"]  # two of four experts per token
