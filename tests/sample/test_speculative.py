"""Speculative decoding: greedy output equals plain greedy for every attention kind, and the
sampled tokens follow the target's distribution (chi-square tests)."""

import numpy as np
import pytest
import torch

from llmlab.model.attention import ATTENTION
from llmlab.sample.generate import SamplingConfig, generate, seen_tokens, token_probs
from llmlab.sample.speculative import (ShortlistHead, frequent_tokens, shortlisted, speculative_generate, verify,
                                       verify_greedy)
from tests.conftest import test_config, test_configs, tiny_model

KINDS = test_configs(ATTENTION)
SWA, MLA = test_config(ATTENTION, "swa"), test_config(ATTENTION, "mla")


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for a chi-square variable with ``df`` degrees of freedom."""
    from scipy.stats import chi2

    return float(chi2.sf(x, df))


def chi2_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's chi-square p-value, pooling outcomes with small expected counts."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return chi2_sf(stat, int(keep.sum()) - 1)


@pytest.mark.parametrize("attn", KINDS, ids=[k["kind"] for k in KINDS])
def test_greedy_speculative_equals_plain_greedy(attn):
    target = tiny_model(0, attention=attn, init_std=0.3)
    draft = tiny_model(1, attention=attn, n_layers=1, init_std=0.3)
    prompt = [3, 5, 7, 9, 11]
    plain = generate(target, torch.tensor([prompt]), SamplingConfig(max_new_tokens=24, temperature=0.0))[0].tolist()
    spec, stats = speculative_generate(target, prompt, SamplingConfig(max_new_tokens=24, temperature=0.0), 4, draft)
    assert spec == plain
    assert stats.proposed > 0 and stats.accepted < stats.proposed  # both paths ran: rejections happened
    # a perfect draft (the target itself) is always accepted: k + 1 tokens per target forward
    same, s2 = speculative_generate(target, prompt, SamplingConfig(max_new_tokens=24, temperature=0.0), 4, target)
    assert same == plain and s2.acceptance == 1.0 and s2.rounds == 5
    # past the context window the caches are refilled and rolled back without error
    long, _ = speculative_generate(target, prompt, SamplingConfig(max_new_tokens=80, temperature=0.0), 4, draft)
    assert len(long) == len(prompt) + 80


def test_speculative_decoding_runs_both_models_in_inference_mode_and_leaves_them_trainable():
    """As plain decoding does (no autograd bookkeeping per operation: about 10% of a small
    model's time); the models train afterwards as before."""
    target = tiny_model(0, init_std=0.3)
    draft = tiny_model(1, n_layers=1, init_std=0.3)
    modes = []
    for model in (target, draft):
        model.register_forward_pre_hook(lambda m, args: modes.append((m, torch.is_inference_mode_enabled())))
    speculative_generate(target, [3, 5, 7], SamplingConfig(max_new_tokens=8, temperature=0.0), 3, draft)
    assert {m for m, _ in modes} == {target, draft} and all(on for _, on in modes)
    target.train()
    target(torch.tensor([[3, 5, 7]]), torch.tensor([[5, 7, 9]])).loss.backward()
    assert target.lm_head.weight.grad is not None


def test_greedy_speculative_with_repetition_penalty_equals_plain():
    """Greedy rounds take the arg-max of the penalised logits, each draft position seeing the
    drafts before it, as plain decoding would have."""
    target = tiny_model(0, init_std=0.3)
    draft = tiny_model(1, n_layers=1, init_std=0.3)
    prompt = [3, 5, 7, 3, 5]
    cfg = SamplingConfig(max_new_tokens=30, temperature=0.0, repetition_penalty=1.8)
    plain = generate(target, torch.tensor([prompt]), cfg)[0].tolist()
    unpenalised = generate(target, torch.tensor([prompt]), SamplingConfig(max_new_tokens=30, temperature=0.0))
    assert plain != unpenalised[0].tolist()  # the penalty changes the text, so the test has teeth
    spec, stats = speculative_generate(target, prompt, cfg, 4, draft)
    assert spec == plain and 0 < stats.accepted < stats.proposed
    same, s2 = speculative_generate(target, prompt, cfg, 4, target)  # the target as its own draft
    assert same == plain and s2.acceptance == 1.0


def test_greedy_verify_is_verify_on_one_hot_distributions():
    g = torch.Generator().manual_seed(0)
    V, n = 6, 4
    for _ in range(200):
        best = torch.randint(0, V, (n + 1,), generator=g).tolist()
        drafts = [b if torch.rand((), generator=g) < 0.7 else int(torch.randint(0, V, (), generator=g))
                  for b in best[:n]]
        p = torch.nn.functional.one_hot(torch.tensor(best), V).float()
        q = torch.nn.functional.one_hot(torch.tensor(drafts), V).float()
        assert verify_greedy(best, drafts) == verify(p, q, drafts, g)


@pytest.mark.parametrize("attn", [{"kind": "mha"}, SWA], ids=["mha", "swa"])
def test_confidence_stop_drafts_less_and_keeps_greedy_output(attn):
    """spec.min_confidence ends a round's drafting after an unsure draft: the output stays the
    target's greedy output, and a threshold no draft reaches leaves one draft per round."""
    target = tiny_model(0, attention=attn, init_std=0.3)
    draft = tiny_model(1, attention=attn, n_layers=1, init_std=0.3)
    prompt = [3, 5, 7, 9, 11]
    cfg = SamplingConfig(max_new_tokens=24, temperature=0.0)
    plain = generate(target, torch.tensor([prompt]), cfg)[0].tolist()
    proposed = {}
    for threshold in (0.0, 0.2, 1.0):
        out, stats = speculative_generate(target, prompt, cfg, 4, draft, min_confidence=threshold)
        assert out == plain, threshold
        proposed[threshold] = stats.proposed
    assert proposed[1.0] == stats.rounds  # every round stops after its first draft
    assert proposed[1.0] < proposed[0.2] < proposed[0.0]
    # past the context window too, where the caches refill and roll back
    long_cfg = SamplingConfig(max_new_tokens=80, temperature=0.0)
    long, _ = speculative_generate(target, prompt, long_cfg, 4, draft, min_confidence=0.2)
    assert long == generate(target, torch.tensor([prompt]), long_cfg)[0].tolist()


def test_confidence_stop_with_mtp_heads_keeps_greedy_output():
    model = tiny_model(0, mtp_heads=3, init_std=0.3)
    prompt = [3, 5, 7, 9, 11]
    cfg = SamplingConfig(max_new_tokens=20, temperature=0.0)  # inside the 32-token context
    out, stats = speculative_generate(model, prompt, cfg, 4, min_confidence=1.0)
    assert out == generate(model, torch.tensor([prompt]), cfg)[0].tolist()
    assert stats.proposed == stats.rounds  # one head's draft per round


def overfit_cycle(model, period: int = 7, steps: int = 60):
    """Teach a tiny model (and its MTP heads) a repeating sequence, so its heads agree."""
    seq = torch.arange(33) % period + 1
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        shift = int(torch.randint(0, period, ()))
        batch = ((seq + shift) % period + 1)[None]
        loss = model(batch[:, :-1], targets=batch[:, 1:]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.mark.parametrize("attn", [{"kind": "mha"}, SWA, MLA], ids=["mha", "swa", "mla"])
def test_self_speculative_with_mtp_heads_equals_plain_greedy(attn):
    prompt = [3, 5, 7, 9, 11]
    random = tiny_model(0, attention=attn, mtp_heads=3, init_std=0.3)  # heads that mostly miss
    trained = overfit_cycle(tiny_model(0, attention=attn, mtp_heads=3))  # heads that mostly hit
    for model in (random, trained):
        cfg = SamplingConfig(max_new_tokens=40, temperature=0.0)
        plain = generate(model, torch.tensor([prompt]), cfg)[0].tolist()
        spec, stats = speculative_generate(model, prompt, cfg, 4)
        assert spec == plain and stats.proposed > 0
        assert stats.target_forwards <= stats.rounds + 2  # one per round, plus the prefill and one refill
    assert stats.acceptance > 0.5 and stats.target_forwards < 40 / 2  # the trained heads save forwards


@pytest.mark.parametrize("q", [[[0.1, 0.1, 0.2, 0.3, 0.3], [0.3, 0.3, 0.2, 0.1, 0.1]],
                               [[0.0, 0.5, 0.0, 0.5, 0.0], [0.4, 0.0, 0.6, 0.0, 0.0]]],
                         ids=["full", "shortlist"])
def test_verify_draws_from_the_target_distribution(q):
    """The kernel alone: whatever q proposes, the first emitted token follows p[0] and the
    first two follow p[0] x p[1] when the first draft is accepted; also when q proposes only
    some tokens (a draft shortlist), so the others come from the residual alone."""
    g = torch.Generator().manual_seed(0)
    V = 5
    p = torch.tensor([[0.5, 0.2, 0.2, 0.1, 0.0], [0.1, 0.1, 0.1, 0.1, 0.6], [0.2] * 5])
    q = torch.tensor(q)
    first = np.zeros(V)
    pairs = np.zeros((V, V))
    n = 20000
    # the drafts drawn from q up front, one column per round (independent of verify's own draws)
    all_drafts = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(2)], 1).tolist()
    for drafts in all_drafts:
        j, nxt = verify(p, q, drafts, g)
        emitted = [*drafts[:j], nxt]
        first[emitted[0]] += 1
        if len(emitted) >= 2:
            pairs[emitted[0], emitted[1]] += 1
    assert first[4] == 0  # a token the target never draws is never emitted
    assert chi2_p(first, p[0].numpy()) > 1e-3
    # given an accepted first token, the second follows p[1]
    second = pairs.sum(0)
    assert chi2_p(second, p[1].numpy()) > 1e-3


# 1,000 generations each (the classic mistake of drawing a rejected position from p instead of
# the residual max(p - q, 0) fails this at p < 1e-14 with them): the plain case runs by default;
# the other two are `slow` (make test-all), since their exactness is also checked by the greedy
# tests and the kernel test
@pytest.mark.parametrize("min_confidence, shortlist", [
    pytest.param(0.0, None, id="plain"),
    pytest.param(0.3, None, id="confidence-stop", marks=pytest.mark.slow),
    pytest.param(0.0, [0, 2, 3], id="draft-shortlist", marks=pytest.mark.slow)])
def test_sampled_tokens_follow_the_target_distribution_with_filters(min_confidence, shortlist):
    """End to end on a 6-token vocabulary: the joint distribution of the first two sampled
    tokens, under temperature, top-k and a repetition penalty, matches the target's, also
    when rounds stop drafting at an unsure draft, and when the draft may propose only half
    the vocabulary (the others come from the residual alone)."""
    V = 6
    target = tiny_model(0, vocab_size=V, vocab_multiple=8, init_std=0.5, n_layers=1)
    draft = tiny_model(3, vocab_size=V, vocab_multiple=8, init_std=0.5, n_layers=1)
    cfg = SamplingConfig(max_new_tokens=2, temperature=1.2, top_k=4, repetition_penalty=1.5)
    prompt = [1, 2, 1]
    with torch.no_grad():  # the exact target distribution of (t1, t2)
        joint = np.zeros((V, V))
        p1 = token_probs(target(torch.tensor([prompt])).logits[:, -1, :V], cfg, seen_tokens(torch.tensor([prompt]), V))[0]
        for a in range(V):
            ctx = torch.tensor([prompt + [a]])
            p2 = token_probs(target(ctx).logits[:, -1, :V], cfg, seen_tokens(ctx, V))[0]
            joint[a] = (p1[a] * p2).numpy()
    g = torch.Generator().manual_seed(0)
    counts = np.zeros((V, V))
    proposed = accepted = rounds = 0
    for _ in range(1000):
        out, stats = speculative_generate(target, prompt, cfg, 3, draft, generator=g, min_confidence=min_confidence,
                                          draft_vocab=torch.tensor(shortlist) if shortlist else None)
        counts[out[3], out[4]] += 1
        proposed, accepted, rounds = proposed + stats.proposed, accepted + stats.accepted, rounds + stats.rounds
    assert 0.05 < accepted / proposed < 0.95  # the draft disagrees often enough to test rejections
    if min_confidence:
        assert rounds < proposed < 3 * rounds  # some rounds stopped early, some did not
    assert chi2_p(counts.ravel(), joint.ravel()) > 1e-3


def test_shortlist_head_scores_only_its_tokens():
    model = tiny_model(0, init_std=0.3)
    h = torch.randn(2, 3, model.lm_head.in_features)
    ids = torch.tensor([1, 5, 40, 96])
    with torch.no_grad():
        full, short = model.lm_head(h), ShortlistHead(model.lm_head, ids)(h)
    assert short.shape == full.shape
    assert torch.allclose(short[..., ids], full[..., ids], atol=1e-6)
    off = torch.ones(full.shape[-1], dtype=torch.bool)
    off[ids] = False
    assert torch.isneginf(short[..., off]).all()
    # the 2 most frequent, ties to the lower id, returned sorted
    assert frequent_tokens(torch.tensor([3, 9, 1, 9, 0]), 2).tolist() == [1, 3]
    assert frequent_tokens(torch.tensor([3, 9, 1, 9, 0]), 3).tolist() == [0, 1, 3]


def test_greedy_output_is_exact_with_a_draft_shortlist():
    """The draft proposes only shortlisted tokens; output stays the target's greedy output,
    and the draft's own head is back afterwards."""
    target = tiny_model(0, init_std=0.3)
    draft = tiny_model(1, n_layers=1, init_std=0.3)
    prompt = [3, 5, 7, 9, 11]
    cfg = SamplingConfig(max_new_tokens=24, temperature=0.0)
    plain = generate(target, torch.tensor([prompt]), cfg)[0].tolist()
    head = draft.lm_head
    out, full = speculative_generate(target, prompt, cfg, 4, target)  # a perfect draft ...
    assert out == plain and full.acceptance == 1.0
    used = sorted(set(plain[len(prompt):]))
    out, _ = speculative_generate(target, prompt, cfg, 4, draft, draft_vocab=torch.tensor(used))
    assert out == plain and draft.lm_head is head
    # ... loses every proposal when its shortlist leaves out every token the target picks
    unused = torch.tensor([t for t in range(97) if t not in used])
    perfect = tiny_model(0, init_std=0.3)  # the target's weights in a separate module
    out, none = speculative_generate(target, prompt, cfg, 4, perfect, draft_vocab=unused)
    assert out == plain and none.proposed > 0 and none.accepted == 0
    out, only = speculative_generate(target, prompt, cfg, 4, perfect, draft_vocab=torch.tensor(used))
    assert out == plain and only.acceptance == 1.0
    with shortlisted(perfect, torch.tensor(used)):
        assert isinstance(perfect.lm_head, ShortlistHead)
    assert not isinstance(perfect.lm_head, ShortlistHead)


def test_caches_roll_back_exactly():
    """After truncating, decoding continues exactly as if the rolled-back tokens never came."""
    for attn in KINDS:
        model = tiny_model(0, attention=attn, init_std=0.3)
        x = torch.randint(0, 97, (1, 20), generator=torch.Generator().manual_seed(0))
        cache = model.new_cache(1, slack=5)
        with torch.no_grad():
            model(x[:, :12], cache=cache)
            model(torch.randint(0, 97, (1, 5)), cache=cache)  # 5 tokens to reject
            cache.truncate(12)
            rolled = model(x[:, 12:], cache=cache).logits
            full = model(x).logits[:, 12:]
        assert torch.allclose(rolled, full, atol=1e-5), attn["kind"]
