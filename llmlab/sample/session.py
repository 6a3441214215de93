"""Decoding a set of prompts: plain (prompts of one length batched together) or speculative
(with a draft model or the model's own MTP heads), a streaming writer for a single sample, and
the timing that pairs a speculative run with plain decoding of the same tokens. What
``llmlab sample`` runs between reading its settings and printing the results."""

from __future__ import annotations

import dataclasses
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from llmlab.errors import UserError
from llmlab.sample.generate import SamplingConfig, generate
from llmlab.sample.speculative import frequent_tokens, speculative_generate
from llmlab.sample.threads import ThreadPicker


class StreamWriter:
    """Prints a single sample's text as its tokens arrive, holding back a partial character."""

    def __init__(self, tok):
        self.tok, self.ids, self.printed = tok, [], ""

    def __call__(self, token: int) -> None:
        self.ids.append(int(token))
        text = self.tok.decode(self.ids, skip_special=True)
        if text.endswith("\ufffd"):  # a multi-byte character is not complete yet
            return
        sys.stdout.write(text[len(self.printed):])
        sys.stdout.flush()
        self.printed = text


def completion_text(tok, row: list[int], eos_id) -> str:
    if eos_id is not None and eos_id in row:
        row = row[:row.index(eos_id)]
    return tok.decode(row, skip_special=True)


def plain_decode(model, encoded, n, sampling, eos_id, gen, writer, pack="auto", graphs=False, threads=None):
    """Prompts of one token length share a batch (no padding, so every row is exact).
    ``threads``: a `ThreadPicker` that sets every batch's steps' thread count."""
    device = next(model.parameters()).device
    by_length: dict[int, list[int]] = {}
    for i, ids in enumerate(encoded):
        by_length.setdefault(len(ids), []).append(i)
    results: dict[int, list[list[int]]] = {}
    first: list[float] = []
    new_tokens = 0
    t0 = time.perf_counter()

    def on_token(toks):
        if not first:
            first.append(time.perf_counter() - t0)
        if writer is not None:
            writer(int(toks[0]))

    for length, members in by_length.items():
        x = torch.tensor([encoded[i] for i in members for _ in range(n)], device=device)
        out = generate(model, x, sampling, eos_id=eos_id, generator=gen, on_token=on_token, pack=pack,
                       graphs=graphs, threads=threads)
        rows = out[:, length:].tolist()
        for r, i in enumerate(m for m in members for _ in range(n)):
            results.setdefault(i, []).append(rows[r])
            new_tokens += len(rows[r][:rows[r].index(eos_id) + 1] if eos_id in rows[r] else rows[r])
    ordered = [(i, row) for i in range(len(encoded)) for row in results[i]]
    return ordered, {"new_tokens": new_tokens, "first_token_s": first[0] if first else None}


def draft_shortlist(n, dckpt, ckpt):
    """``spec.draft_vocab``: the ``n`` tokens most frequent in the draft's training data (or,
    for a draft saved without token counts, the target's); None for all."""
    if n is None:
        return None
    counts = dckpt.token_counts()
    counts = counts if counts is not None else ckpt.token_counts()
    if counts is None:
        raise UserError(f"spec.draft_vocab: neither draft={dckpt.path} nor ckpt={ckpt.path} holds token counts "
                        "(token_counts.safetensors, saved by llmlab train); drop spec.draft_vocab or train again")
    if n >= len(counts):
        return None
    return frequent_tokens(counts, n)


def speculative_decode(model, draft, encoded, n, sampling, k, eos_id, gen, writer, min_confidence=0.0, pack="auto",
                 draft_vocab=None):
    """One sequence at a time: each row accepts a different number of drafts per round."""
    results, totals, first = [], {"proposed": 0, "accepted": 0, "forwards": 0, "rounds": 0, "new": 0}, None
    for i, ids in enumerate(encoded):
        for _ in range(n):
            out, st = speculative_generate(model, ids, sampling, k, draft, eos_id, gen, writer, min_confidence, pack,
                                           draft_vocab)
            results.append((i, out[len(ids):]))
            first = st.first_token_s if first is None else first
            totals["proposed"] += st.proposed
            totals["accepted"] += st.accepted
            totals["forwards"] += st.target_forwards
            totals["rounds"] += st.rounds
            totals["new"] += st.new_tokens
    return results, {"new_tokens": totals["new"], "first_token_s": first, "rounds": totals["rounds"],
                     "acceptance": totals["accepted"] / max(1, totals["proposed"]),
                     "tokens_per_forward": totals["new"] / max(1, totals["forwards"])}


def compare_with_plain(model, encoded, n, sampling, results, stats, gen, device, pack="auto",
                       graphs=False) -> dict:
    """Plain decoding of as many tokens per sequence as the speculative run made, timed."""
    t0 = time.perf_counter()
    identical = True
    for (i, row) in results:
        cfg = dataclasses.replace(sampling, max_new_tokens=len(row))
        x = torch.tensor([encoded[i]], device=device)
        out = generate(model, x, cfg, generator=gen, pack=pack, graphs=graphs)[0, len(encoded[i]):].tolist()
        identical = identical and out == row
    plain_s = time.perf_counter() - t0
    return {"plain_seconds": plain_s, "plain_tokens_per_s": stats["new_tokens"] / max(plain_s, 1e-9),
            "identical": identical}


@dataclass
class Decoded:
    """What a decoding run made: each sample's text with its prompt's index, the figures
    (``record``, kept in samples.jsonl) and the line that reports them."""

    completions: list[tuple[int, str]]
    record: dict[str, Any]
    line: str
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def decode_prompts(model, tok, encoded: list[list[int]], n: int, sampling: SamplingConfig, eos_id: int | None,
                   gen: torch.Generator, *, draft=None, mtp: bool = False, k: int = 4, min_confidence: float = 0.0,
                   draft_vocab=None, compare: bool = True, pack: Any = "auto", amp=None,
                   writer: "StreamWriter | None" = None, graphs: bool = False,
                   threads: ThreadPicker | None = None) -> Decoded:
    """Decode ``n`` samples of every encoded prompt, speculatively with ``draft`` or with the
    model's MTP heads (``mtp``), plainly otherwise; with ``compare``, time plain decoding of
    the same tokens too and report the speed-up. ``threads``: a `ThreadPicker` that sets the
    thread count of plain decoding's steps on the CPU (speculative decoding and the plain
    decoding it is compared with run on the count that is set)."""
    amp = amp if amp is not None else nullcontext()
    speculative = draft is not None or mtp
    t0 = time.perf_counter()
    with amp:
        if speculative:
            results, stats = speculative_decode(model, draft, encoded, n, sampling, k, eos_id, gen, writer,
                                                min_confidence, pack, draft_vocab)
        else:
            results, stats = plain_decode(model, encoded, n, sampling, eos_id, gen, writer, pack, graphs, threads)
    elapsed = time.perf_counter() - t0
    completions = [(i, completion_text(tok, row, eos_id)) for i, row in results]
    new_tokens, ttft = stats["new_tokens"], stats["first_token_s"]
    line = (f"{new_tokens} tokens in {elapsed:.2f}s: {new_tokens / max(elapsed, 1e-9):,.1f} tokens/s; "
            f"time to first token {ttft * 1000:.0f} ms" if ttft is not None else f"{new_tokens} tokens")
    record = {"new_tokens": new_tokens, "seconds": elapsed, "tokens_per_s": new_tokens / max(elapsed, 1e-9),
              "first_token_s": ttft}
    if threads is not None and not speculative:  # the counts the picker ran the steps on
        line += f"; {threads.said()}"
        record["threads"] = {str(c): k for c, k in threads.steps.most_common()}
    if speculative:
        line += (f"; acceptance {stats['acceptance']:.1%}, {stats['tokens_per_forward']:.2f} tokens per target "
                 f"forward")
        record.update({key: stats[key] for key in ("acceptance", "tokens_per_forward", "rounds")})
        if compare:
            device = next(model.parameters()).device
            with amp:
                base = compare_with_plain(model, encoded, n, sampling, results, stats, gen, device, pack, graphs)
            base["speedup"] = base["plain_seconds"] / max(elapsed, 1e-9)
            record.update(base)
            same = ("; same tokens as plain greedy" if base["identical"] else "; differs from plain greedy") \
                if sampling.temperature == 0 else ""
            line += f"; plain decoding {base['plain_tokens_per_s']:,.1f} tokens/s, speed-up {base['speedup']:.2f}x{same}"
    return Decoded(completions, record, line, elapsed)
