"""Training objectives (config group ``objective``): how a window of tokens becomes model
inputs and targets, and whether attention may look ahead."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmlab.errors import ConfigError
from llmlab.model.config import OBJECTIVE
from llmlab.registry import Checked, bounded
IGNORE = -100  # targets with this id carry no loss


class Objective:
    causal = True

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

    def make_batch(self, window, vocab_size, generator=None):
        return window[:, :-1], window[:, 1:]


@OBJECTIVE.register("mlm")
class MaskedLM(Objective):
    """BERT's masked LM (Devlin et al. 2019, section 3.1, task 1). Of the tokens chosen with
    probability ``mask_prob``, ``mask_replace`` become [MASK] (id = vocab_size),
    ``random_replace`` a random token, and the rest stay; only chosen tokens carry loss."""

    @dataclass
    class Config(Checked):
        kind: str = "mlm"
        mask_prob: float = bounded(0.15, above=0, below=1)
        mask_replace: float = bounded(0.8, at_least=0)
        random_replace: float = bounded(0.1, at_least=0)

        def check(self, prefix: str) -> None:
            if self.mask_replace + self.random_replace > 1:
                raise ConfigError(f"{prefix}.mask_replace + {prefix}.random_replace: must be within [0, 1]")

    causal = False

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
