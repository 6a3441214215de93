"""How runs and their settings are named: a sweep job's directory (`path_slug`) and a
report's label (`compact_override`) write a sweep's expansion of a large round number short
(``1e12``, not ``1000000000000.0``), so a swept value and a typed one read alike; a FLOP budget
is spelt ``6e15`` or ``1e15*6`` (`parse_flops`); two runs that train the same thing share a
`run_id`. The CLI and training write these and the report reads them back, so they sit below
all three."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from llmlab.errors import ConfigError


def compact_number(m: re.Match) -> str:
    """``100000000.0`` -> ``1e8``, ``3000000`` -> ``3e6``: a budget keeps its digits in a name."""
    plain = m.group(0)[:-2] if m.group(0).endswith(".0") else m.group(0)
    value = float(plain)
    if value >= 1e6:
        mantissa, exponent = f"{value:e}".split("e")
        short = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
        return short if len(short) < len(plain) else plain
    return plain


def compact_override(override: str) -> str:
    """``train.max_flops=1000000000000.0`` (a sweep's expansion of ``1e12``) -> ``train.max_flops=1e12``:
    how a report labels a run, so a swept value and a typed one read (and group) alike."""
    key, sep, value = override.partition("=")
    return key + sep + re.sub(r"^\d+(\.0)?$", compact_number, value) if sep else override


def path_slug(text: str, limit: int = 120) -> str:
    """A short, path-safe form of a job's overrides for its sweep directory name; large round
    numbers in their short form (``train.max_flops=1e8``). ``limit`` leaves room for four swept
    keys (variant, size, budget, seed: about 75 characters) within a file name's 255."""
    text = re.sub(r"(?<==)\d+(\.0)?(?=,|_|$)", compact_number, str(text))
    text = re.sub(r"[^A-Za-z0-9._=,+-]+", "-", text.replace("/", "-"))
    text = re.sub(r"-{2,}", "-", text).strip("-")
    return text[:limit].rstrip("-,") or "defaults"


FLOPS_TEXT = re.compile(r"^\s*[0-9.eE+-]+(\s*\*\s*[0-9.eE+-]+)*\s*$")


def parse_flops(value: Any, key: str) -> float:
    """A FLOP budget from a number or a product such as ``1e15*6``; > 0."""
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str) and FLOPS_TEXT.match(value):
        try:
            number = math.prod(float(f) for f in value.split("*"))
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):
        raise ConfigError(f"{key}: must be a number of FLOPs such as 6e15 or 1e15*6, got {value!r}")
    if number <= 0:
        raise ConfigError(f"{key}: must be > 0, got {number:g}")
    return number


# Keys that change how a run is watched or where it runs, not what it computes: they stay out
# of the run id, so a run can be resumed with another log interval, device or time budget.
RUN_ID_IGNORES = {"hydra", "logger", "device", "cache_dir"}
RUN_ID_IGNORES_TRAIN = {"resume", "resume_weights_only", "max_time", "max_steps", "log_every", "keep_checkpoints", "prompts",
                        "sample_tokens", "ckpt_every", "compile", "fsdp", "head_loss", "context_parallel",
                        "activation_checkpointing", "eval_tasks"}


# Settings added after runs existed: at these values a run trains what it trained before they
# existed, so they stay out of its id (a run keeps its id, and resumes, across the upgrade).
RUN_ID_ADDED = {"sched": {"warmup_share": None, "branches": [], "branch_flops": []}, "model": {"parametrization": "standard", "logit_softcap": None},
                "optim": {"ns_precision": "bf16"}, "attention": {"eps": 1e-6},
                "train": {"z_loss": 0.0, "ema": 0.0}, "data": {"doc_mask": False}}
RUN_ID_ADDED_TOP = {"init": None}  # top-level settings likewise
OLD_DEFAULT_WARMUP = 50  # sched.warmup's default before it could be null
# train.steps's default before the default recipe changed, and now: a budget run (max_flops,
# max_tokens) never uses it and cannot set it, so its id keeps the old value
OLD_DEFAULT_STEPS, DEFAULT_STEPS = 1000, 750


def _as_before(cfg: Mapping[str, Any]) -> dict:
    """``cfg`` as it would have been written before the `RUN_ID_ADDED` settings existed."""
    out = {k: v for k, v in cfg.items() if not (k in RUN_ID_ADDED_TOP and v == RUN_ID_ADDED_TOP[k])}
    for section, added in RUN_ID_ADDED.items():
        if isinstance(cfg.get(section), Mapping):
            out[section] = {k: v for k, v in cfg[section].items() if not (k in added and v == added[k])}
    model = out.get("model")
    if isinstance(model, Mapping) and "parametrization" not in model:
        out["model"] = {k: v for k, v in model.items() if k != "mup_base_width"}
    sched, train = out.get("sched"), out.get("train") or {}
    if (isinstance(sched, Mapping) and "warmup" in sched and sched["warmup"] is None
            and "warmup_share" not in sched and train.get("max_flops") is None):
        out["sched"] = {**sched, "warmup": OLD_DEFAULT_WARMUP}  # an unset warm-up is what it was: 50 steps
    if (isinstance(cfg.get("train"), Mapping) and train.get("steps") == DEFAULT_STEPS
            and (train.get("max_flops") is not None or train.get("max_tokens") is not None)):
        out["train"] = {**train, "steps": OLD_DEFAULT_STEPS}
    return out


def run_id(cfg: Mapping[str, Any]) -> str:
    """A short hash of the resolved config: equal for two runs that train the same thing."""
    import hashlib
    import json

    cfg = _as_before(cfg)
    kept = {k: v for k, v in cfg.items() if k not in RUN_ID_IGNORES}
    kept["train"] = {k: v for k, v in dict(cfg.get("train") or {}).items() if k not in RUN_ID_IGNORES_TRAIN}
    text = json.dumps(kept, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
