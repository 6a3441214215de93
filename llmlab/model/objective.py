"""Training objectives (config group ``objective``): how a window of tokens becomes model
inputs and targets, and whether attention may look ahead."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmlab.errors import ConfigError
from llmlab.registry import Registry

OBJECTIVE = Registry("objective", group="objective")
IGNORE = -100  # targets with this id carry no loss


class Objective:
    causal = True

    @dataclass
    class Config:
        kind: str = ""

    def __init__(self, cfg):
        self.cfg = cfg

    def extra_tokens(self) -> int:
        """Ids the model needs beyond the tokenizer's (a [MASK] token, say)."""
        return 0

    def make_batch(self, window: torch.Tensor, vocab_size: int, generator: torch.Generator | None = None):
        """window: (B, T + 1) token ids -> (inputs, targets), each (B, T)."""
        raise NotImplementedError


@OBJECTIVE.register("clm")
class CausalLM(Objective):
    """Next-token prediction: targets are the inputs shifted by one."""

    @dataclass
    class Config:
        kind: str = "clm"

    def make_batch(self, window, vocab_size, generator=None):
        return window[:, :-1], window[:, 1:]


@OBJECTIVE.register("mlm")
class MaskedLM(Objective):
    """BERT's masked LM (Devlin et al. 2019, section 3.1, task 1). Of the tokens chosen with
    probability ``mask_prob``, ``mask_replace`` become [MASK] (id = vocab_size),
    ``random_replace`` a random token, and the rest stay; only chosen tokens carry loss."""

    causal = False

    @dataclass
    class Config:
        kind: str = "mlm"
        mask_prob: float = 0.15
        mask_replace: float = 0.8
        random_replace: float = 0.1

        def check(self, prefix: str) -> None:
            if not 0 < self.mask_prob < 1:
                raise ConfigError(f"{prefix}.mask_prob: must be in (0, 1), got {self.mask_prob}")
            if self.mask_replace < 0 or self.random_replace < 0 or self.mask_replace + self.random_replace > 1:
                raise ConfigError(f"{prefix}.mask_replace + {prefix}.random_replace: must be within [0, 1]")

    def extra_tokens(self) -> int:
        return 1

    def make_batch(self, window, vocab_size, generator=None):
        tokens = window[:, :-1]
        device = tokens.device
        u = torch.rand(tokens.shape, generator=generator, device=device)
        chosen = u < self.cfg.mask_prob
        # a second draw splits the chosen tokens 80/10/10
        r = torch.rand(tokens.shape, generator=generator, device=device)
        to_mask = chosen & (r < self.cfg.mask_replace)
        to_random = chosen & (r >= self.cfg.mask_replace) & (r < self.cfg.mask_replace + self.cfg.random_replace)
        random_ids = torch.randint(0, vocab_size, tokens.shape, generator=generator, device=device)
        inputs = torch.where(to_mask, torch.full_like(tokens, vocab_size), tokens)
        inputs = torch.where(to_random, random_ids, inputs)
        targets = torch.where(chosen, tokens, torch.full_like(tokens, IGNORE))
        return inputs, targets
