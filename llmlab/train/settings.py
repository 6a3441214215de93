"""The typed ``train`` config: every section checked before any work starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from llmlab.data.corpus import CORPUS
from llmlab.data.tokenizer import TOKENIZER
from llmlab.errors import ConfigError
from llmlab.model.loss import HEAD_LOSS
from llmlab.model.transformer import ModelSpec, Transformer
from llmlab.registry import parse_dataclass
from llmlab.train.device import PRECISIONS, resolve_device
from llmlab.train.distill import DistillConfig
from llmlab.train.loggers import LOGGER
from llmlab.train.optim import OPTIMIZER
from llmlab.train.schedule import SCHEDULE


@dataclass
class LoopConfig:
    """The ``train`` section."""

    steps: int = 600
    batch_size: int = 16
    grad_accum: int = 1
    batch_tokens: int | None = None  # tokens per optimizer step; sets grad_accum from batch_size * max_seq_len
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    log_every: int = 10
    eval_every: int = 200  # 0 = only at the end
    eval_windows: int = 64  # val windows per periodic eval; `llmlab eval` scores the whole split
    ckpt_every: int = 200  # 0 = only at the end
    keep_checkpoints: int = 2
    compile: bool = False
    prompts: list[str] = field(default_factory=lambda: ["def ", "class ", "import "])
    sample_tokens: int = 48
    resume: str | None = "auto"  # auto: this run dir's latest checkpoint if any; a path; null: start fresh
    resume_weights_only: bool = False  # resume a checkpoint without trainer.pt: its weights, a fresh optimizer
    max_tokens: int | None = None  # the run's length in tokens; replaces `steps` (the schedule spans it)
    max_steps: int | None = None  # stop (saving a checkpoint) at this step; the schedule still spans `steps`
    max_time: float | None = None  # seconds; stop (saving a checkpoint) when training has run this long
    fsdp: bool = False  # under torchrun: shard parameters, gradients and optimizer state (FSDP2) instead of DDP
    head_loss: str = "auto"  # LM head + cross-entropy: auto | fused (chunked, no logits kept) | plain

    def check(self, prefix: str) -> None:
        for key in ("steps", "batch_size", "grad_accum", "log_every"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{prefix}.{key}: must be >= 1, got {getattr(self, key)}")
        for key in ("eval_every", "ckpt_every", "eval_windows", "keep_checkpoints", "sample_tokens"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{prefix}.{key}: must be >= 0, got {getattr(self, key)}")
        if self.grad_clip < 0:
            raise ConfigError(f"{prefix}.grad_clip: must be >= 0, got {self.grad_clip}")
        for key in ("max_tokens", "max_steps"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise ConfigError(f"{prefix}.{key}: must be > 0 or null, got {value}")
        if self.head_loss not in HEAD_LOSS:
            raise ConfigError(f"{prefix}.head_loss: unknown '{self.head_loss}'; allowed: {', '.join(HEAD_LOSS)}")
        if self.max_time is not None and self.max_time < 0:
            raise ConfigError(f"{prefix}.max_time: must be >= 0 or null, got {self.max_time}")


TOP_LEVEL = {"seed", "device", "precision", "cache_dir", "data", "tokenizer", "model", "attention", "norm", "pos",
             "objective", "optim", "sched", "logger", "train", "distill"}


@dataclass
class TrainJob:
    seed: int
    device: str
    precision: str
    cache_dir: str | None
    data: Any
    tokenizer: Any
    spec: ModelSpec
    optim: Any
    sched: Any
    logger: Any
    loop: LoopConfig
    distill: DistillConfig


def check_train_config(cfg: Mapping[str, Any]) -> TrainJob:
    """Check every section of a composed ``train`` config; the first problem is a ConfigError
    that names its key. Also builds the model on the meta device, so size constraints between
    parts (heads and kv_heads, say) fail here rather than after data preparation."""
    for key in cfg:
        if key not in TOP_LEVEL and key != "hydra":
            raise ConfigError(f"{key}: unknown key; allowed: {', '.join(sorted(TOP_LEVEL))}")
    precision = str(cfg.get("precision", "auto"))
    if precision not in PRECISIONS:
        raise ConfigError(f"precision: unknown '{precision}'; allowed: {', '.join(PRECISIONS)}")
    seed = cfg.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"seed: expected an integer, got {seed!r}")
    tokenizer = TOKENIZER.config(cfg.get("tokenizer"), "tokenizer")
    resolve_device(str(cfg.get("device", "auto")))  # an unknown or absent device is a config mistake
    job = TrainJob(
        seed=seed,
        device=str(cfg.get("device", "auto")),
        precision=precision,
        cache_dir=cfg.get("cache_dir"),
        data=CORPUS.config(cfg.get("data"), "data"),
        tokenizer=tokenizer,
        # the real vocabulary is known after tokenizing; the configured size stands in for the checks
        spec=ModelSpec.from_config(cfg, vocab_size=getattr(tokenizer, "vocab_size", 257)),
        optim=OPTIMIZER.config(cfg.get("optim"), "optim"),
        sched=SCHEDULE.config(cfg.get("sched"), "sched"),
        logger=LOGGER.config(cfg.get("logger"), "logger"),
        loop=parse_dataclass(LoopConfig, cfg.get("train"), "train"),
        distill=parse_dataclass(DistillConfig, cfg.get("distill") or {}, "distill"),
    )
    if job.distill.teacher and job.distill.data == "teacher" and job.distill.prompt_tokens > job.spec.model.max_seq_len:
        raise ConfigError(f"distill.prompt_tokens: must be at most model.max_seq_len={job.spec.model.max_seq_len}, "
                          f"got {job.distill.prompt_tokens}")
    if job.loop.batch_tokens is not None:
        micro = job.loop.batch_size * job.spec.model.max_seq_len
        if job.loop.batch_tokens < micro or job.loop.batch_tokens % micro:
            raise ConfigError(f"train.batch_tokens: {job.loop.batch_tokens} is not a multiple of train.batch_size * "
                              f"model.max_seq_len = {micro}")
        job.loop.grad_accum = job.loop.batch_tokens // micro
    with torch.device("meta"):
        Transformer(job.spec)
    return job


# Keys that change how a run is watched or where it runs, not what it computes: they stay out
# of the run id, so a run can be resumed with another log interval, device or time budget.
RUN_ID_IGNORES = {"hydra", "logger", "device", "cache_dir"}
RUN_ID_IGNORES_TRAIN = {"resume", "resume_weights_only", "max_time", "max_steps", "log_every", "keep_checkpoints", "prompts",
                        "sample_tokens", "ckpt_every", "compile", "fsdp", "head_loss"}


def run_id(cfg: Mapping[str, Any]) -> str:
    """A short hash of the resolved config: equal for two runs that train the same thing."""
    import hashlib
    import json

    kept = {k: v for k, v in cfg.items() if k not in RUN_ID_IGNORES}
    kept["train"] = {k: v for k, v in dict(cfg.get("train") or {}).items() if k not in RUN_ID_IGNORES_TRAIN}
    text = json.dumps(kept, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
