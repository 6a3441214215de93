"""The ``analysis=attention`` kind."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from llmlab.errors import UserError
from llmlab.eval.analysis import ANALYSIS
from llmlab.files import atomic_write_text
from llmlab.registry import bounded

if TYPE_CHECKING:
    import torch


@ANALYSIS.register("attention")
class AttentionAnalysis:
    """Entropy, support, normalised support and head diversity per layer and head, with
    figures (see `llmlab.eval.attention`)."""

    @dataclass
    class Config:
        kind: str = "attention"
        windows: int = bounded(16, at_least=1)  # windows per split, evenly spaced over it
        seq_len: int | None = bounded(None, at_least=2)  # tokens per window; null: the model's max_seq_len
        example_tokens: int = bounded(48, at_least=1)  # the heat-maps show each head's attention over this many tokens of one val window

    def __init__(self, cfg):
        self.cfg = cfg

    def run(self, model, sources: dict[str, np.ndarray], tokenizer, batch: int, device: torch.device,
            out_dir: Path, title: str) -> dict:
        from llmlab.eval import attention as A

        block = self.cfg.seq_len or model.max_seq_len
        if block > model.max_seq_len:
            raise UserError(f"analysis.seq_len: {block} is longer than the model's max_seq_len={model.max_seq_len}")
        raw, summaries = {}, {}
        for split, tokens in sources.items():
            if len(tokens) < block + 1:
                raise UserError(f"analysis: the {split} tokens ({len(tokens)}) are fewer than one window of "
                                f"{block + 1}; lower analysis.seq_len")
            raw[split] = A.collect(model, tokens, block, self.cfg.windows, batch, device)
            summaries[split] = A.summarize(raw[split])
        figures = A.draw(raw, summaries, out_dir, title)
        example_split = "val" if "val" in sources else next(iter(sources))
        ids = [int(i) for i in sources[example_split][:min(self.cfg.example_tokens, block)]]
        figures += A.example_heatmaps(model, ids, A.token_labels(tokenizer, ids), out_dir, title, device)
        result = {"kind": "attention", "seq_len": block, "splits": summaries,
                  "example": {"split": example_split, "tokens": ids},
                  "figures": [p.name for p in figures]}
        atomic_write_text(out_dir / "attention.json", json.dumps(result, indent=2))
        return result
