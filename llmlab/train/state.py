"""What a training run carries from one step to the next besides its weights. Each part saves
and loads its own state (``state_dict`` / ``load_state_dict``, the protocol torch's
distributed checkpoint expects), and `llmlab.train.resume` maps the parts to a checkpoint's
files, so no part's fields are reached into from outside."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Progress:
    """How far the run is: optimizer steps done, tokens trained on, the last validation."""

    step: int = 0
    tokens_seen: int = 0
    last_val: dict[str, float] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens_seen": self.tokens_seen, "val": self.last_val}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        step, tokens, val = int(state["step"]), int(state.get("tokens_seen", 0)), state.get("val") or {}
        if step < 0 or tokens < 0 or not isinstance(val, dict):
            raise ValueError(f"step {step}, tokens_seen {tokens}, val {type(val).__name__}: not a run's progress")
        for key, value in val.items():  # the last evaluation's figures: numbers (NaN too), as a save writes them
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"val.{key} is {str(value)[:40]!r}, not a number")
        self.step, self.tokens_seen, self.last_val = step, tokens, val


class RankRandom:
    """This rank's random streams: torch's global generator (dropout, MoE router jitter) and
    the CPU generator that draws MLM masks, seeded apart on each rank."""

    def __init__(self, seed: int, rank: int):
        self.mask = torch.Generator().manual_seed(seed * 1000 + rank)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"torch": torch.get_rng_state(), "mask": self.mask.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        torch.set_rng_state(state["torch"])
        self.mask.set_state(state["mask"])
