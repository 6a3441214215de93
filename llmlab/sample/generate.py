"""Autoregressive generation with a KV cache, and the sampling rules."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from llmlab.errors import UserError
from llmlab.model.attention import decode_attention
from llmlab.model.packing import packed_linears
from llmlab.model.transformer import lean_decoding
from llmlab.sample.graphs import GraphedStep, why_not
from llmlab.sample.settings import SamplingConfig  # noqa: F401  (its home is torch-free; imported from here too)
from llmlab.sample.threads import ThreadPicker


def penalize(logits: torch.Tensor, seen: torch.Tensor | None, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty: logits of tokens already in the text (``seen``, a (B, V)
    bool mask) are divided by ``penalty`` when positive and multiplied when negative."""
    if seen is None or penalty == 1.0:
        return logits
    logits = logits.float()
    penalized = torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)
    # a penalty near 0 or past 1e38 overflows: the largest finite logit says the same
    big = torch.finfo(penalized.dtype).max
    return penalized.nan_to_num(nan=-big, posinf=big, neginf=-big).where(logits.isfinite(), logits)


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """Keep the ``top_k`` largest logits, then the smallest set whose probability reaches
    ``top_p`` (nucleus sampling, Holtzman et al. 2020); the rest become -inf. logits: (B, V)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
        drop_sorted = before >= top_p  # the first token always stays
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def filter_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the top token's."""
    if min_p <= 0:
        return logits
    probs = logits.softmax(dim=-1)
    return logits.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))


def token_probs(logits: torch.Tensor, cfg: SamplingConfig, seen: torch.Tensor | None = None) -> torch.Tensor:
    """The distribution a token is drawn from, (B, V) -> (B, V): penalty, temperature, then the
    top-k, top-p and min-p filters. Greedy (temperature 0) is one-hot on the arg-max."""
    logits = penalize(logits.float(), seen, cfg.repetition_penalty)
    if cfg.temperature == 0:
        return F.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    # shifted so the largest logit is 0 before dividing: the same distribution, and a temperature
    # near 0 sends the others to -inf (greedy) instead of every logit to inf (NaN probabilities)
    logits = filter_logits((logits - logits.amax(dim=-1, keepdim=True)) / cfg.temperature, cfg.top_k, cfg.top_p)
    return filter_min_p(logits, cfg.min_p).softmax(dim=-1)


def next_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None,
               seen: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of ``logits`` (B, V) -> (B,)."""
    if cfg.temperature == 0:
        return penalize(logits, seen, cfg.repetition_penalty).argmax(dim=-1)
    try:
        return torch.multinomial(token_probs(logits, cfg, seen), 1, generator=generator).squeeze(-1)
    except RuntimeError:
        if not bool(logits.isfinite().all()):  # asked only when drawing failed: no cost per token
            raise UserError("sampling: the model's next-token logits are not finite (nan or inf): its weights "
                            "diverged in training or were damaged; sample an earlier checkpoint") from None
        raise


def seen_tokens(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, T) ids -> (B, vocab) bool: which tokens each row holds."""
    seen = torch.zeros(ids.shape[0], vocab, dtype=torch.bool, device=ids.device)
    return seen.scatter_(1, ids.clamp(max=vocab - 1), True)


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


def grad_free(*models):
    """Inference mode, which skips autograd's bookkeeping per operation (version counters,
    views): much of a small model's time per token. Sharded (FSDP2) parameters are gathered
    into tensors whose version counters FSDP sets, which inference mode forbids: there, no_grad."""
    if all(type(p.detach()) is torch.Tensor for model in models if model is not None for p in model.parameters()):
        return torch.inference_mode()
    return torch.no_grad()


@contextmanager
def decoding(*models, pack="auto", keep: bool = True) -> Iterator[bool]:
    """The kernels decoding runs with: prepacked CPU weights (``llmlab.model.packing``), a
    token's forward without per-call costs (`lean_decoding`) and, on CUDA, SDPA backends that
    take a new key length each step (``llmlab.model.attention.decode_backends``). Yields
    whether weights were packed."""
    with decode_attention(_model_device(models[0])), lean_decoding(*models), \
            packed_linears(*models, enabled=pack, keep=keep) as packed:
        yield packed


def generate(model, prompt: torch.Tensor, cfg: SamplingConfig, eos_id: int | None = None,
             generator: torch.Generator | None = None, use_cache: bool = True,
             on_token: Callable[[torch.Tensor], None] | None = None, pack="auto",
             graphs: bool = False, threads: ThreadPicker | None = None) -> torch.Tensor:
    """Extend ``prompt`` (B, T) by up to ``cfg.max_new_tokens`` tokens; returns (B, T + n).

    A row that produced ``eos_id`` keeps emitting it; generation stops when every row has.
    With the cache, the prompt is run once and each step feeds one token. When the context
    reaches ``model.max_seq_len``, the cache is refilled with the latest half window.
    ``pack``: prepacked CPU weights (``llmlab.model.packing``): "auto", True or False.
    ``graphs``: on CUDA, each new token's step replayed as a recorded CUDA graph
    (`llmlab.sample.graphs`) where the model allows (`graphs.why_not`); the same tokens.
    ``threads``: on the CPU, the `ThreadPicker` that sets each step's thread count from the
    load other processes put on the CPUs; the count is put back at the end.

    Decoding runs in inference mode (`grad_free`). The ids come back as an ordinary tensor, so
    a caller may train on them (distillation on a teacher's text).
    """
    was_training = model.training
    model.eval()
    try:
        with grad_free(model), decoding(model, pack=pack, keep=not was_training):  # training: weights will change
            out = _generate(model, prompt, cfg, eos_id, generator, use_cache, on_token, graphs, threads)
    finally:
        model.train(was_training)
        if threads is not None:
            threads.restore()
    return out.clone()


def _generate(model, prompt, cfg, eos_id, generator, use_cache, on_token, graphs=False,
              threads: ThreadPicker | None = None) -> torch.Tensor:
    vocab = model.vocab_size
    window = model.max_seq_len
    out = prompt
    done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    seen = seen_tokens(prompt, vocab) if cfg.repetition_penalty != 1.0 else None
    cache, feed, graphed = None, None, None
    for _ in range(cfg.max_new_tokens):
        if use_cache:
            if cache is None or cache.pos + feed.shape[1] > window:
                # (re)fill: the whole prompt at first, the latest half window once the context is full
                # (at least the newest token: a window of one position has no half to keep)
                feed = out[:, -(max(1, window // 2) if cache is not None else window):]
                if graphed is not None:
                    cache.truncate(0)  # the recorded step holds this cache's buffers
                else:
                    cache = model.new_cache(out.shape[0], window)
                    if graphs and cfg.max_new_tokens > 1 and why_not(model, cache) is None:
                        graphed = GraphedStep(model, cache)
                if threads is not None:
                    threads.prefill()
                logits = model(feed, cache=cache).logits
            elif graphed is not None:
                logits = graphed.step(feed, cache.pos)
                if graphed.broken is not None:  # said once, then decoded as without graphs
                    from llmlab import console
                    console.err.print(f"CUDA graph decoding: {graphed.broken}", style="yellow")
                    graphed, graphs = None, False  # nor tried again at a refill
            else:
                if threads is not None:
                    threads.before()
                logits = model(feed, cache=cache).logits
        else:
            logits = model(out[:, -window:]).logits
        tok = next_token(logits[:, -1, :vocab], cfg, generator, seen)
        if seen is not None:
            seen[torch.arange(tok.shape[0]), tok] = True
        if eos_id is not None:
            tok = torch.where(done, torch.full_like(tok, eos_id), tok)
            done = done | (tok == eos_id)
        out = torch.cat([out, tok[:, None]], dim=1)
        feed = tok[:, None]
        if on_token is not None:
            on_token(tok)
        if eos_id is not None and bool(done.all()):
            break
    return out


def decode_setting(max_seq_len: int, prompt_tokens: int = 16, tokens: int = 48) -> dict[str, int]:
    """The prompt length and new tokens a decode timing uses: as asked, or shorter where the
    context window is (then the figure is not comparable with the others, and says so)."""
    prompt = max(1, min(prompt_tokens, max_seq_len // 4))
    return {"prompt_tokens": prompt, "tokens": max(2, min(tokens, max_seq_len - prompt)), "batch": 1}


def decode_speed(model, prompt_tokens: int = 16, tokens: int = 48, repeats: int = 5, pack="auto"):
    """Greedy decode rate with the KV cache, batch 1, after a ``prompt_tokens`` prompt: tokens/s
    after the first new token (prefill and warm-up left out), timed ``repeats`` times, as a
    `llmlab.perf.Rate` (median, spread, other load)."""
    import time

    from llmlab.perf import other_load, rate, snapshot

    device = next(model.parameters()).device
    setting = decode_setting(model.max_seq_len, prompt_tokens, tokens)
    prompt = (torch.arange(setting["prompt_tokens"], device=device) * 7 % model.embed.num_embeddings).unsqueeze(0)
    rates: list[float] = []
    start = snapshot()
    for _ in range(repeats):
        marks: list[float] = []

        def on_token(_):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            marks.append(time.perf_counter())

        generate(model, prompt, SamplingConfig(max_new_tokens=setting["tokens"], temperature=0.0),
                 on_token=on_token, pack=pack)
        rates.append((len(marks) - 1) / max(marks[-1] - marks[0], 1e-9))
    return rate(rates, other_load(start, snapshot()))
