"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023), exact.

Each round a cheap proposer drafts up to k tokens d_1..d_k with known distributions q_i; the
target scores all of them in one forward pass, giving p_1..p_{k+1}. Draft d_i is accepted with
probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection the token is drawn from the
residual norm(max(0, p_i - q_i)) instead, and when all k pass, one more comes from p_{k+1}.
Every emitted token is then distributed exactly as the target's own sampling would draw it
(Leviathan et al., appendix A.1); with greedy sampling both p and q are one-hot, so the output
is the target's greedy output token for token.

Proposers:
- a draft model (``draft=<ckpt>``), which keeps a KV cache of its own;
- the target's own multi-token-prediction heads (self-speculative): the state that produced
  the last accepted token also proposes the next ``mtp_heads`` tokens, so each round costs a
  single target forward.

p and q are the distributions after the sampling rules (penalty, temperature, top-k, top-p,
min-p), so the filters stay exact too. Rejected tokens are rolled back from the caches.

A draft may propose from a shortlist of frequent tokens only (``draft_vocab``; Zhao et al.
2025, FR-Spec): its LM head, often half a small draft's weights, then multiplies only those
rows. q is zero off the list, which the residual max(0, p - q) accounts for, so decoding stays
exact; a token off the list is never drafted, only emitted by the target.
"""

from __future__ import annotations

import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

from llmlab.model.kept import kept_tensors
from llmlab.sample.generate import SamplingConfig, decoding, grad_free, next_token, seen_tokens, token_probs


def verify(p: torch.Tensor, q: torch.Tensor, drafts: list[int], generator: torch.Generator | None
           ) -> tuple[int, int]:
    """Accept a prefix of ``drafts`` and pick the token after it.

    p: (n + 1, V) target distributions at each draft position and one past the last;
    q: (n, V) the distributions the drafts were drawn from. Returns (accepted, next token)."""
    for i, d in enumerate(drafts):
        u = torch.rand((), generator=generator, device=p.device)
        if u * q[i, d] < p[i, d]:  # accept with probability min(1, p/q)
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        total = residual.sum()
        residual = residual / total if total > 0 else p[i]
        return i, int(torch.multinomial(residual, 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def verify_greedy(best: list[int], drafts: list[int]) -> tuple[int, int]:
    """``verify`` when p and q are one-hot, which it reduces to: drafts are accepted while they
    equal the target's arg-max ``best`` (n + 1 of them), and the next token is the target's
    arg-max where the first one differs. Returns (accepted, next token)."""
    j = 0
    while j < len(drafts) and drafts[j] == best[j]:
        j += 1
    return j, best[j]


def frequent_tokens(counts: torch.Tensor, n: int) -> torch.Tensor:
    """The ids of the ``n`` most frequent tokens by ``counts`` (vocab,), ties to the lower id;
    sorted."""
    return torch.argsort(torch.as_tensor(counts), descending=True, stable=True)[:n].sort().values


class ShortlistHead(nn.Module):
    """An LM head that scores only the tokens ``ids``; every other logit is -inf. ``sub``
    holds those rows of the head's weight (an ``nn.Linear``, so decoding can prepack it)."""

    def __init__(self, head: nn.Linear, ids: torch.Tensor):
        super().__init__()
        w = head.weight
        self.width = head.out_features
        self.register_buffer("ids", ids.to(w.device), persistent=False)
        self.sub = nn.Linear(head.in_features, len(ids), bias=head.bias is not None, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            self.sub.weight.copy_(w[self.ids])
            if head.bias is not None:
                self.sub.bias.copy_(head.bias[self.ids])

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        scores = self.sub(h)
        out = scores.new_full((*scores.shape[:-1], self.width), float("-inf"))
        return out.index_copy_(-1, self.ids, scores)


# draft -> (key of the head weight and shortlist, the ShortlistHead made for them)
_shortlists: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, ShortlistHead]] = weakref.WeakKeyDictionary()


@contextmanager
def shortlisted(model: nn.Module, ids: torch.Tensor | None) -> Iterator[None]:
    """While open, ``model``'s LM head scores only ``ids`` (None: every token). The head is
    made once per model, shortlist and weight version, and the model's own head comes back on exit."""
    if ids is None or len(ids) >= model.lm_head.out_features:
        yield
        return
    head = model.lm_head
    key = (head.weight.data_ptr(), head.weight._version, tuple(ids.tolist()))
    hit = _shortlists.get(model)
    if hit is None or hit[0] != key:
        with kept_tensors():
            hit = (key, ShortlistHead(head, ids))
        _shortlists[model] = hit
    model.lm_head = hit[1]
    try:
        yield
    finally:
        model.lm_head = head


class CachedModel:
    """A model and its KV cache: feed tokens, roll back, refill when the window is full."""

    def __init__(self, model, slack: int):
        self.model, self.slack = model, slack
        self.window = model.max_seq_len
        self.cache = model.new_cache(1, self.window, slack=slack)

    @property
    def length(self) -> int:
        return self.cache.pos

    def feed(self, ids: list[int]):
        x = torch.tensor([ids], device=next(self.model.parameters()).device)
        return self.model(x, cache=self.cache)

    def rollback(self, length: int) -> None:
        self.cache.truncate(length)

    def restart(self) -> None:
        self.cache = self.model.new_cache(1, self.window, slack=self.slack)


@dataclass
class SpecStats:
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    target_forwards: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    first_token_s: float | None = None

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0


def speculative_generate(target, prompt: list[int], cfg: SamplingConfig, k: int, draft=None,
                         eos_id: int | None = None, generator: torch.Generator | None = None,
                         on_token: Callable[[int], None] | None = None,
                         min_confidence: float = 0.0, pack="auto", draft_vocab: torch.Tensor | None = None
                         ) -> tuple[list[int], SpecStats]:
    """Extend one prompt by up to ``cfg.max_new_tokens`` tokens, drafting with ``draft`` or,
    without one, with the target's MTP heads, up to ``k`` tokens a round (fewer where the
    proposer's probability of a draft falls below ``min_confidence``). Returns (prompt + new
    tokens, stats). ``pack``: prepacked CPU weights, as for ``generate``. ``draft_vocab``: the
    token ids the draft may propose (`frequent_tokens`); None: all. Runs in inference mode, as
    plain decoding does (`grad_free`): 1.39 -> 1.25 s for 200 tokens of a 9.7M target with a
    1.7M draft, against autograd's no_grad mode, the same tokens."""
    if draft is None and not len(target.mtp):
        raise ValueError("self-speculative decoding needs a model with MTP heads (model.mtp_heads > 0)")
    if draft_vocab is not None and (draft is None or draft is target):
        raise ValueError("draft_vocab shortlists a separate draft model's head")
    target.eval()
    if draft is not None:
        draft.eval()
    with grad_free(target, draft), shortlisted(draft, draft_vocab), decoding(target, draft, pack=pack):
        return _speculative(target, prompt, cfg, k, draft, eos_id, generator, on_token, min_confidence)


def _speculative(target, prompt, cfg, k, draft, eos_id, generator, on_token, min_confidence):
    k = k if draft is not None else min(k, len(target.mtp))
    vocab = target.vocab_size
    window = min(target.max_seq_len, draft.max_seq_len) if draft is not None else target.max_seq_len
    T = CachedModel(target, slack=k + 1)
    D = CachedModel(draft, slack=k + 1) if draft is not None else None
    out = list(prompt)
    n_prompt = len(prompt)
    penalty = cfg.repetition_penalty != 1.0
    greedy = cfg.temperature == 0
    stats = SpecStats()
    t0 = time.perf_counter()
    state = None  # the target's final state at the last position it processed (MTP proposals)
    start = 0  # context start: tokens before it are out of the window

    device = next(target.parameters()).device
    # tokens in the text so far, for the repetition penalty: (1, V), kept up to date by emit
    seen = seen_tokens(torch.tensor([out], device=device), vocab) if penalty else None

    def emit(tokens: list[int]) -> bool:
        """Append accepted tokens; True when generation is over."""
        for tok in tokens:
            out.append(tok)
            if seen is not None:
                seen[0, tok] = True
            stats.new_tokens += 1
            if stats.first_token_s is None:
                stats.first_token_s = time.perf_counter() - t0
            if on_token is not None:
                on_token(tok)
            if (eos_id is not None and tok == eos_id) or stats.new_tokens >= cfg.max_new_tokens:
                return True
        return False

    finished = cfg.max_new_tokens == 0
    while not finished:
        if len(out) - start > window or T.length == 0:
            # (re)fill exactly where plain decoding does: the latest `window` tokens at first,
            # the latest half window once the context is full
            start = max(start, len(out) - (window // 2 if T.length else window))
            T.restart()
            if D is not None:
                D.restart()
            state = None
            if len(out) - start > 1:
                res = T.feed(out[start:-1])
                stats.target_forwards += 1
                state = res.hidden[:, -1:]
        # drafts the window has room for: the verify pass must see them all in one context
        n_draft = min(k, window - (len(out) - start))
        # -- propose ------------------------------------------------------------------------
        drafts, qs = [], []
        # the penalty mask at each draft position: the text so far plus the drafts before it
        draft_seen = seen.clone() if seen is not None else None

        def draw(logits: torch.Tensor) -> bool:
            """Draft a token from ``logits``; False when the round should stop drafting."""
            if greedy:  # q is one-hot on the arg-max: no need to build it
                d = int(next_token(logits[None], cfg, None, draft_seen))
            else:
                q = token_probs(logits[None], cfg, draft_seen)[0]
                d = int(torch.multinomial(q, 1, generator=generator))
                qs.append(q)
            drafts.append(d)
            if draft_seen is not None:
                draft_seen[0, d] = True
            return min_confidence <= 0 or float(torch.softmax(logits.float(), -1)[d]) >= min_confidence

        if D is not None and n_draft:
            ids = out[start + D.length:]
            for _ in range(n_draft):
                going = draw(D.feed(ids).logits[0, -1, :vocab])
                ids = drafts[-1:]
                if not going:
                    break
        elif D is None and state is not None:
            for head_logits in target.mtp_logits(state)[:n_draft]:
                if not draw(head_logits[0, -1, :vocab]):
                    break
        # -- verify -------------------------------------------------------------------------
        base = T.length
        res = T.feed([out[-1], *drafts])
        stats.target_forwards += 1
        rows = None
        if seen is not None:  # row i: the text plus drafts[:i]
            rows = seen.repeat(len(drafts) + 1, 1)
            for i, d in enumerate(drafts):
                rows[i + 1:, d] = True
        logits = res.logits[0, :, :vocab]  # (n + 1, V), all positions at once
        if greedy:
            j, nxt = verify_greedy(next_token(logits, cfg, None, rows).tolist(), drafts)
        else:
            ps = token_probs(logits, cfg, rows)
            j, nxt = verify(ps, torch.stack(qs) if qs else ps[:0], drafts, generator)
        stats.rounds += 1
        stats.proposed += len(drafts)
        stats.accepted += j
        T.rollback(base + 1 + j)  # keep the pending token and the accepted drafts
        state = res.hidden[:, j:j + 1]
        if D is not None:
            D.rollback(min(D.length, len(out) - start + j))  # what it saw of the accepted text
        finished = emit([*drafts[:j], nxt])
    stats.seconds = time.perf_counter() - t0
    return out[:n_prompt + stats.new_tokens], stats
