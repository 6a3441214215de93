"""The fused head-and-loss (`linear_cross_entropy`) against the plain path it replaces:
``F.cross_entropy(F.linear(h, W))`` and its autograd gradients."""

import pytest
import torch
import torch.nn.functional as F

import llmlab.model.loss as loss_mod
from llmlab.model.loss import chunk_rows, linear_cross_entropy, use_fused
from llmlab.model.objective import IGNORE
from llmlab.model.transformer import Transformer
from tests.conftest import tiny_spec


def plain_and_fused(h, w, t, scale=1.0, **kw):
    """Loss and (h, w) gradients of ``scale * loss`` by both paths."""
    out = []
    up = torch.promote_types(h.dtype, torch.float32)
    for fn in (lambda: F.cross_entropy(F.linear(h, w).to(up), t, ignore_index=IGNORE),
               lambda: linear_cross_entropy(h, w, t, IGNORE)):
        h.grad = w.grad = None
        loss = fn()
        (scale * loss).backward()
        out.append((loss.detach(), h.grad.clone(), w.grad.clone()))
    return out


def data(n=37, d=8, v=29, dtype=torch.float64, ignored=0.25, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    w = torch.randn(v, d, generator=g, dtype=dtype).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    t[torch.rand(n, generator=g) < ignored] = IGNORE
    return h, w, t


@pytest.mark.parametrize("compiled_form", [False, True])
@pytest.mark.parametrize("chunk_bytes", [1 << 30, 8 * 29 * 10])  # one chunk; float64 chunks of 10 rows, the last 7
# the CPU's blocks within a chunk (eager): one block; blocks of 4 rows, a chunk's last one shorter
@pytest.mark.parametrize("block_bytes", [1 << 20, 8 * 29 * 4])
def test_matches_plain_cross_entropy_and_its_gradients(monkeypatch, chunk_bytes, compiled_form, block_bytes):
    monkeypatch.setattr(loss_mod, "CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(loss_mod, "CPU_BLOCK_BYTES", block_bytes)
    # the expression inductor fuses, checked here without compiling
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiled_form)
    h, w, t = data()
    (l0, gh0, gw0), (l1, gh1, gw1) = plain_and_fused(h, w, t, scale=3.0)
    assert (t == IGNORE).any() and (t != IGNORE).any()
    torch.testing.assert_close(l1, l0.to(l1.dtype), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gh1, gh0, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gw1, gw0, rtol=1e-10, atol=1e-12)
    assert gh1[t == IGNORE].abs().max() == 0  # rows without a target get no gradient


def test_without_grad_only_the_loss(monkeypatch):
    monkeypatch.setattr(loss_mod, "CHUNK_BYTES", 8 * 29 * 10)
    h, w, t = data()
    with torch.no_grad():
        loss = linear_cross_entropy(h, w, t, IGNORE)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, F.cross_entropy(F.linear(h, w), t, ignore_index=IGNORE).detach(),
                               rtol=1e-12, atol=1e-12)


def test_chunk_rows_split_evenly_under_the_byte_limit(monkeypatch):
    monkeypatch.setattr(loss_mod, "CHUNK_BYTES", 4 * 100 * 10)  # 10 rows of a 100-token float32 head
    assert chunk_rows(10, 100) == 10
    assert chunk_rows(25, 100) == 9  # 3 chunks of 9, 9, 7 rather than 10, 10, 5
    assert chunk_rows(5, 10**6) == 1
    assert chunk_rows(25, 100, itemsize=2) == 13  # bf16: up to 20 rows, so two chunks of 13 and 12


def test_no_counted_target_gives_nan_like_cross_entropy():
    h, w, t = data(ignored=1.0)
    (l0, _, _), (l1, gh1, gw1) = plain_and_fused(h, w, t)
    assert l0.isnan() and l1.isnan()
    assert gh1.abs().max() == 0 and gw1.abs().max() == 0


@pytest.mark.parametrize("block_bytes", [1 << 20, 4 * 50 * 5])  # one block; blocks of 5 rows, the last 4
def test_bf16_autocast_agrees_with_the_plain_autocast_path(monkeypatch, block_bytes):
    monkeypatch.setattr(loss_mod, "CPU_BLOCK_BYTES", block_bytes)
    h, w, t = data(n=64, d=32, v=50, dtype=torch.float32, ignored=0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (l0, gh0, gw0), (l1, gh1, gw1) = plain_and_fused(h, w, t)
    assert gh1.dtype == h.dtype and gw1.dtype == w.dtype  # gradients land in the parameters' dtype
    torch.testing.assert_close(l1, l0, rtol=1e-2, atol=1e-2)
    for a, b in ((gh1, gh0), (gw1, gw0)):
        assert (a - b).norm() / b.norm() < 2e-2


def test_fused_only_where_it_pays(monkeypatch):
    h, w = torch.zeros(4, 8, 16), torch.zeros(100, 16)
    monkeypatch.setattr(loss_mod, "FUSED_MIN_LOGITS", 3200)
    assert use_fused(h, w)
    assert not use_fused(h[:3], w)  # 2,400 logits: the plain path
    with torch.autocast("cpu", dtype=torch.float16):
        assert not use_fused(h, w)  # fp16 needs the loss scaler on the logits' gradient
        assert not use_fused(h, w, "fused")
    assert use_fused(h[:3], w, "fused") and not use_fused(h, w, "plain")


@pytest.mark.parametrize("spec_kw", [{}, {"mtp_heads": 2}, {"objective": {"kind": "mlm"}}])
def test_model_training_forward_without_logits_matches(monkeypatch, spec_kw):
    """``model(x, y, logits=False)``, the call `llmlab train` makes, gives the plain forward's
    loss, metrics and parameter gradients (MTP heads and masked-LM targets included)."""
    monkeypatch.setattr(loss_mod, "FUSED_MIN_LOGITS", 0)
    torch.manual_seed(0)
    model = Transformer(tiny_spec(**spec_kw)).double().train()
    window = torch.randint(0, 97, (3, 17))
    x, y = model.objective.make_batch(window, model.vocab_size, torch.Generator().manual_seed(1))
    results = []
    for logits in (True, False):
        model.zero_grad()
        out = model(x, y, logits=logits)
        out.loss.backward()
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (plain, g0), (fused, g1) = results
    assert plain.logits is not None and fused.logits is None
    torch.testing.assert_close(fused.loss, plain.loss, rtol=1e-12, atol=1e-12)
    assert fused.metrics.keys() == plain.metrics.keys()
    for k in plain.metrics:
        torch.testing.assert_close(fused.metrics[k], plain.metrics[k], rtol=1e-12, atol=1e-12)
    assert g0.keys() == g1.keys()
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-9, atol=1e-12, msg=n)


def test_fused_training_forward_compiles_to_one_graph(monkeypatch):
    import torch._dynamo
    monkeypatch.setattr(loss_mod, "FUSED_MIN_LOGITS", 0)
    torch.manual_seed(0)
    model = Transformer(tiny_spec()).train()
    x = torch.randint(0, 97, (2, 32))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x, x, logits=False)
    assert explained.graph_break_count == 0, [str(b.reason).splitlines()[0] for b in explained.break_reasons]
    assert explained.graph_count == 1
