"""A run's checkpoints from the trainer's side: which one to resume, restoring everything
that decides the next step, and saving (every rank takes part; rank 0 writes)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from llmlab import console
from llmlab.errors import ConfigError, UserError
from llmlab.files import OLD, TMP
from llmlab.train.checkpoint import Checkpoint, latest_in_run, load_checkpoint, save_checkpoint
from llmlab.train.distributed import (barrier, broadcast, full_model_state, full_optimizer_state, gather,
                                      load_optimizer_state)
from llmlab.train.loggers import JsonlWriter
from llmlab.train.recovery import STEP_IN_NAME


def resume_checkpoint(loop, run_dir: Path, rid: str) -> Checkpoint | None:
    """The checkpoint ``train.resume`` names: this run directory's latest (``auto``), a path,
    or none. ``auto`` refuses a directory that holds a run of another config."""
    if loop.resume == "auto":
        found = latest_in_run(run_dir)
        if found is None:
            return None
    elif loop.resume:
        found = loop.resume
    else:
        return None
    try:
        ckpt = load_checkpoint(found)
    except UserError as e:
        raise UserError(f"train.resume: {str(e).removeprefix('ckpt: ')}") from e
    if loop.resume == "auto":
        refuse_foreign(run_dir, ckpt.state.get("run_id"), rid, ckpt.path)
    return ckpt


def refuse_foreign(run_dir: Path, other, rid: str, path: Path) -> None:
    if other and other != rid:
        raise ConfigError(
            f"train.resume: {run_dir} holds a run of another config (run id {other}; this config is "
            f"{rid}); use a new hydra.run.dir, train.resume={path} to continue from it anyway, "
            "or train.resume=null to start over in this directory")


def check_owner(loop, run_dir: Path, rid: str) -> None:
    """Before anything in ``run_dir`` is touched (leftovers cleaned, records cut back): with
    ``train.resume=auto``, refuse a directory whose newest checkpoint, or a killed save's copy
    of a newer step, belongs to another config. Reads ``state.json`` files only."""
    if loop.resume != "auto":
        return
    root = Path(run_dir) / "checkpoints"
    newest = None
    for p in (root.iterdir() if root.is_dir() else ()):
        m = STEP_IN_NAME.search(p.name)
        if m is None or p.is_symlink() or not (p.name.startswith(("step_", TMP, OLD))):
            continue
        try:
            state = json.loads((p / "state.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(state, dict) and (newest is None or int(m.group(1)) > newest[0]):
            newest = (int(m.group(1)), state.get("run_id"), p)
    if newest is not None:
        refuse_foreign(run_dir, newest[1], rid, newest[2])


def check_same_tokenizer(tokenizer_path: Path, ckpt: Checkpoint) -> None:
    from llmlab.data.tokenizer import vocab_sizes_if_different

    sizes = vocab_sizes_if_different(tokenizer_path, ckpt.tokenizer_path)
    if sizes is not None:
        raise ConfigError(f"tokenizer: this run's tokenizer ({sizes[0]:,} tokens) is not the one {ckpt.path} was "
                          f"trained with ({sizes[1]:,} tokens); resume with that run's tokenizer and data "
                          "settings, or start fresh with train.resume=null")


def restore(trainer, ckpt: Checkpoint) -> None:
    """Everything that decides the next step: optimizer, RNGs, data position, and the
    records of the steps before (``metrics.jsonl`` and ``samples.jsonl`` are cut back to the
    checkpoint's step, so no step is logged twice)."""
    rank = trainer.dist.rank
    state = ckpt.trainer_state()
    if state is None:
        if not trainer.loop.resume_weights_only:
            raise UserError(f"train.resume: {ckpt.path} has no trainer.pt (optimizer and random state), so the run "
                            "cannot continue its curve; pass train.resume_weights_only=true to continue from its "
                            "weights with a fresh optimizer, or train.resume=null to start over")
        console.out.print(f"resuming from the weights of {ckpt.path} alone: fresh optimizer and random state, so "
                          "the curve differs from an uninterrupted run", style="yellow")
        state = {}
    if "optimizer" in state:
        load_optimizer_state(trainer.model, trainer.optimizer, state["optimizer"])
    if "scaler" in state and trainer.scaler.is_enabled():
        trainer.scaler.load_state_dict(state["scaler"])
    torch_rng, mask_rng = state.get("torch_rng_by_rank"), state.get("mask_rng_by_rank")
    if torch_rng:  # a rank with no saved state of its own (more ranks than before) keeps its seed
        if rank < len(torch_rng):
            torch.set_rng_state(torch_rng[rank])
            trainer.mask_rng.set_state(mask_rng[rank])
    distill_rng = state.get("distill_rng_by_rank")
    if trainer.distiller is not None and distill_rng and rank < len(distill_rng):
        trainer.distiller.load_state(distill_rng[rank])
    trainer.sampler.load_state(ckpt.state["data_rng"])
    trainer.start_step, trainer.tokens_seen = int(ckpt.state["step"]), int(ckpt.state.get("tokens_seen", 0))
    trainer.last_val = ckpt.state.get("val") or {}
    trainer.carried_window = ckpt.state.get("log_window") or {}
    if trainer.dist.is_main:  # the summary covers the steps before the resume too
        trainer.previous = JsonlWriter.truncate_after(trainer.run_dir / "metrics.jsonl", trainer.start_step)
        JsonlWriter.truncate_after(trainer.run_dir / "samples.jsonl", trainer.start_step)
    console.out.print(f"resumed from {ckpt.path} at step {trainer.start_step}")


def save(trainer, step: int, window: dict | None = None) -> Path | None:
    """Every rank calls this (FSDP gathers its shards); rank 0 writes, the others wait.
    ``window``: the logging interval so far (`LogWindow.carry`), so a resumed run logs the
    same interval average as an uninterrupted one."""
    dist = trainer.dist
    full = full_model_state(trainer.model, dist)
    optim_state = full_optimizer_state(trainer.model, trainer.optimizer, dist)
    rngs = gather((torch.get_rng_state(), trainer.mask_rng.get_state(),
                   trainer.distiller.state() if trainer.distiller is not None else None), dist)
    path = None
    if dist.is_main:
        prepared = trainer.prepared
        weights = {k: full[k] for k in trainer.weight_names}
        state = {"optimizer": optim_state, "torch_rng_by_rank": [r[0] for r in rngs],
                 "mask_rng_by_rank": [r[1] for r in rngs]}
        if trainer.distiller is not None:
            state["distill_rng_by_rank"] = [r[2] for r in rngs]
        if trainer.scaler.is_enabled():
            state["scaler"] = trainer.scaler.state_dict()
        path = save_checkpoint(
            trainer.run_dir / "checkpoints", step, weights, trainer.spec.to_dict(), trainer.job.config,
            prepared.path / "tokenizer.json",
            state={"tokens_seen": trainer.tokens_seen, "val": trainer.last_val, "run_id": trainer.run_id,
                   "world_size": dist.world_size, "data_rng": trainer.sampler.state(),
                   "data_key": prepared.meta["key"], "eos": prepared.meta["eos"],
                   "bytes_per_token": {s: prepared.bytes_per_token(s) for s in ("train", "val")},
                   "log_window": window or {}},
            trainer_state=state, keep=trainer.loop.keep_checkpoints, token_counts=trainer.token_counts())
    barrier(dist)
    return broadcast(path, dist)
