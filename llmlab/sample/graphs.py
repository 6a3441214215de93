"""Decoding with CUDA graphs: a token's step recorded once and replayed.

A small model decodes at the pace of its kernel launches, not of its arithmetic: GPT-2-124M
on an H100 launches some 200 kernels a token, each a few microseconds of the host's time, while
the GPU finishes each in less. A CUDA graph records the step's kernels once and replays them
with one launch (gpt-fast's "reduce-overhead" decode, here without a compiler).

A recorded step must not change shape, so the token's position is a tensor on the device and
every layer attends over its whole preallocated cache, masked past that position
(`KVCache.at`). The prompt is still run by the ordinary forward, which fills the same cache.

Where a model's step cannot be recorded (a kind whose cache is not a plain `KVCache`, a
position scheme that biases scores, a mixture of experts, whose routing picks shapes at run
time), `why_not` says so and decoding launches kernels one by one, as it does on a CPU.
"""

from __future__ import annotations

import contextlib

import torch

from llmlab.model.attention import INLINE_VIEWS, GroupedQueryAttention
from llmlab.model.cache import KVCache, ModelCache
from llmlab.model.transformer import Transformer, hooked


def why_not(model, cache: ModelCache) -> str | None:
    """Why ``model``'s decoding step cannot be recorded as a CUDA graph with ``cache`` (one
    line), or None when it can."""
    if not isinstance(model, Transformer):
        return "not an llmlab Transformer"
    if next(model.parameters()).device.type != "cuda":
        return "not on a CUDA device"
    return unrecordable(model, cache)


def unrecordable(model: Transformer, cache: ModelCache) -> str | None:
    """What in ``model`` or ``cache`` keeps its decoding step from being recorded, on any
    device (one line), or None."""
    if hooked(model):
        return "the model has forward hooks, which must run in Python every token"
    view = model.pos.view(torch.zeros(1, dtype=torch.long, device=next(model.parameters()).device))
    if type(view) not in INLINE_VIEWS:
        return f"pos={model.spec.pos.kind} biases the attention scores"
    for blk, layer in zip(model.blocks, cache.layers):
        attn = blk.attn
        if not (isinstance(attn, GroupedQueryAttention) and attn.decodes_inline and type(layer) is KVCache):
            return f"attention {type(attn).__name__} keeps its own cache or seams"
        if blk.ffn.sparse:
            return "a mixture of experts routes each token to shapes known only at run time"
    return None


class GraphedStep:
    """One decoding step of ``model`` with ``cache``, recorded as a CUDA graph on first use.

    ``step(tokens, pos)`` gives the logits of tokens (B, 1) at position ``pos`` (a plain int,
    the cache's next position) and moves ``cache.pos`` on, as ``model(tokens, cache=cache)``
    does inside `lean_decoding`. The logits may be the graph's own output tensor, overwritten
    by the next step: use them before it. The cache keeps serving the ordinary forward (a prompt,
    a refill after ``cache.truncate(0)``) between steps.

    ``record=False`` runs the same step without recording it, each token: the arithmetic a
    replay does, on any device (its tests run on a CPU)."""

    def __init__(self, model: Transformer, cache: ModelCache, record: bool = True):
        self.model, self.cache = model, cache
        self.graph: torch.cuda.CUDAGraph | None = None
        self.record = record
        self.broken: str | None = None  # why a recorded step was dropped (each step then runs eagerly)
        device = next(model.parameters()).device
        batch = cache.layers[0].k.shape[0]
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.at = torch.zeros(1, dtype=torch.long, device=device)
        self.logits: torch.Tensor | None = None
        self.max_len = cache.layers[0].max_len
        model.pos.check_end(self.max_len)  # a RoPE table grown now, never inside the recording

    def _device(self):
        """The model's GPU as the current one while recording and replaying (it need not be)."""
        return torch.cuda.device(self.at.device) if self.at.device.type == "cuda" else contextlib.nullcontext()

    def _run(self) -> torch.Tensor:
        for layer in self.cache.layers:
            layer.at = self.at
        try:
            return self.model.decode_token(self.tokens, self.cache, at=self.at).logits
        finally:
            for layer in self.cache.layers:
                layer.at = None

    def _record(self) -> torch.Tensor:
        """Warm up on a side stream (as recording asks), record, and return the warm-up's
        logits: the step computed eagerly for the inputs now held."""
        with self._device():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                eager = self._run().clone()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            # autocast's cache of cast weights would hold tensors made outside the graph's pool
            autocast = torch.is_autocast_enabled("cuda")
            dtype = torch.get_autocast_dtype("cuda")
            with torch.autocast("cuda", dtype=dtype, enabled=autocast, cache_enabled=False), \
                    torch.cuda.graph(self.graph):
                self.logits = self._run()
        return eager

    def step(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        if pos >= self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; asked for {pos + 1}")
        self.tokens.copy_(tokens)
        self.at.fill_(pos)
        if not self.record or self.broken is not None:
            logits = self._run()
        elif self.graph is None:
            try:
                logits = self._record()
                with self._device():
                    self.graph.replay()
            except RuntimeError as e:  # an operation this torch build cannot record
                self.broken = f"recording the step failed ({str(e).strip().splitlines()[0]}); decoded without it"
                self.graph = None
                logits = self._run()
            else:
                if not torch.equal(logits, self.logits):  # the same kernels on the same inputs
                    self.broken = "its replay differed from the step it recorded; decoded without it"
                    self.graph = None
        else:
            with self._device():
                self.graph.replay()
            logits = self.logits
        self.cache.pos = pos + 1
        for layer in self.cache.layers:
            layer.length = pos + 1
        return logits
