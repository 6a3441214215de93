"""Knowledge distillation: a trained teacher's next-token distribution as the training target.

    loss = (1 - weight) * CE(student, data) + weight * tau^2 * KL(teacher_tau || student_tau)

(Hinton et al. 2015; tau is ``distill.temperature``). The usual reason to do it here is a draft
for speculative decoding, whose speed-up rests on how often it agrees with its target. Two
sources of windows:

- ``data=corpus``: the training windows themselves;
- ``data=teacher``: each window's first ``prompt_tokens`` tokens are kept and the teacher
  writes the rest (greedy, or sampled at ``gen_temperature``), so the student learns the
  teacher's behaviour on the text the teacher itself produces, where a draft is used
  (sequence-level distillation, Kim and Rush 2016; DistillSpec, Zhou et al. 2024).

The teacher is frozen, runs in eval mode on every rank, and must share the student's tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from llmlab.data.batches import fixed_window_batches
from llmlab.errors import ConfigError, UserError
from llmlab.sample.generate import SamplingConfig, generate
from llmlab.train.settings import DistillConfig

def distill_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over positions of tau^2 * KL(softmax(t / tau) || softmax(s / tau)), in fp32.
    Both (..., V) over the same real vocabulary; the tau^2 keeps gradient scale comparable
    across temperatures (Hinton et al. 2015)."""
    s = F.log_softmax(student_logits.float() / temperature, dim=-1).flatten(0, -2)
    t = F.log_softmax(teacher_logits.float() / temperature, dim=-1).flatten(0, -2)
    return F.kl_div(s, t, log_target=True, reduction="batchmean") * temperature ** 2


class Distiller:
    """The frozen teacher of one training run: rewrites windows, scores the KL term, and
    measures how often the student agrees with it."""

    def __init__(self, cfg: DistillConfig, student, tokenizer_path: Path, device: torch.device, seed: int,
                 rank: int = 0):
        from llmlab.data.tokenizer import vocab_sizes_if_different
        from llmlab.train.checkpoint import build_model, load_checkpoint

        self.cfg = cfg
        try:
            ckpt = load_checkpoint(cfg.teacher)
        except UserError as e:
            raise UserError(f"distill.teacher: {str(e).removeprefix('ckpt: ')}") from e
        self.path = ckpt.path
        if not ckpt.causal or not student.objective.causal:
            raise ConfigError("distill.teacher: distillation needs causal (objective=clm) teacher and student")
        sizes = vocab_sizes_if_different(tokenizer_path, ckpt.tokenizer_path)
        if sizes is not None:
            raise ConfigError(f"distill.teacher: {ckpt.path} uses another tokenizer ({sizes[1]:,} tokens against "
                              f"this run's {sizes[0]:,}); train the student with the teacher's data and tokenizer "
                              "settings")
        with torch.random.fork_rng(devices=[]):  # building it must not move the training random stream
            self.teacher = build_model(ckpt, device).requires_grad_(False)
        block = student.max_seq_len
        if self.teacher.max_seq_len < block:
            raise ConfigError(f"distill.teacher: its context ({self.teacher.max_seq_len}) is shorter than "
                              f"model.max_seq_len={block}; lower model.max_seq_len to at most that")
        self.vocab, self.device = student.vocab_size, device
        self.generator = torch.Generator(device=device).manual_seed(seed * 1000 + rank + 17)
        self.pool: list[torch.Tensor] = []  # data=teacher: written windows not yet trained on

    def next_window(self, draw: Callable[[], torch.Tensor], amp) -> torch.Tensor:
        """The next (B, block + 1) batch of windows to learn from. ``draw`` gives the next
        batch of training windows. data=corpus: that batch. data=teacher: the teacher's
        continuations of their first ``prompt_tokens`` tokens, written ``gen_batch`` windows
        at a time (the prompts of several batches drawn at once) and handed out in order."""
        if self.cfg.data == "corpus":
            return draw()
        if not self.pool:
            first = draw()
            batches = [first] + [draw() for _ in range(-(-self.cfg.gen_batch // len(first)) - 1)]
            prompts = torch.cat(batches)[:, :self.cfg.prompt_tokens].to(self.device)
            sampling = SamplingConfig(max_new_tokens=first.shape[1] - prompts.shape[1],
                                      temperature=self.cfg.gen_temperature)
            with amp:
                written = generate(self.teacher, prompts, sampling, generator=self.generator)
            self.pool = list(written.split(len(first)))
        return self.pool.pop(0)

    def loss(self, x: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
        """The KL term for inputs ``x`` (B, T); call it inside the step's autocast."""
        with torch.no_grad():
            teacher_logits = self.teacher(x).logits[..., :self.vocab]
        return distill_kl(student_logits[..., :self.vocab], teacher_logits, self.cfg.temperature)

    @torch.no_grad()
    def compare(self, student, tokens: np.ndarray, block: int, batch: int, device: torch.device, amp,
                max_windows: int | None) -> dict[str, float]:
        """On fixed windows of ``tokens``: the share of positions where the student's arg-max
        equals the teacher's (the per-token agreement that greedy speculative decoding with the
        student as draft rests on) and the mean KL(teacher || student) at temperature 1."""
        was_training = student.training
        student.eval()
        agree, kl, count = 0, 0.0, 0
        for window in fixed_window_batches(tokens, block, batch, max_windows):
            x = window[:, :-1].to(device)
            with amp:
                s, t = student(x).logits[..., :self.vocab], self.teacher(x).logits[..., :self.vocab]
            agree += int((s.argmax(-1) == t.argmax(-1)).sum())
            kl += float(distill_kl(s, t, 1.0)) * x.numel()
            count += x.numel()
        student.train(was_training)
        return {"val/teacher_agreement": agree / max(1, count), "val/teacher_kl": kl / max(1, count)}

    def state_dict(self) -> dict:
        """What the next windows depend on: the sampling generator and the unread pool."""
        return {"generator": self.generator.get_state().cpu(), "pool": [w.cpu() for w in self.pool]}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.pool = [w.to(self.device) for w in state["pool"]]
