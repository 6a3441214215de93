"""A run's checkpoints from the trainer's side: which one to resume, restoring everything
that decides the next step, and saving (every rank takes part; rank 0 writes). Both iterate
over the run's stateful parts (`llmlab.train.parts.Parts`), each in its slot."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from llmlab import console
from llmlab.errors import ConfigError, UserError
from llmlab.files import OLD, TMP
from llmlab.train.checkpoint import Checkpoint, load_checkpoint, load_latest, save_checkpoint
from llmlab.train.distributed import barrier, broadcast, full_model_state, gather
from llmlab.train.ema import EMA_FILE
from llmlab.train.recovery import STEP_IN_NAME
from llmlab.train.parts import Parts, Slot


def resume_checkpoint(loop, run_dir: Path, rid: str, main: bool = True) -> Checkpoint | None:
    """The checkpoint ``train.resume`` names: this run directory's latest that loads (``auto``),
    a path, or none. ``auto`` refuses a directory that holds a run of another config, and passes
    over a damaged newer checkpoint only aloud: it is named with what is wrong and set aside
    (``main``: this rank renames it) under a name that says so, never trained over."""
    if loop.resume == "auto":
        ckpt, passed = load_latest(Path(run_dir) / "checkpoints", trainer=True)
        if ckpt is None and passed:
            _, q, why = passed[0]
            raise UserError(f"train.resume: {run_dir} has no usable checkpoint: the latest, {q}, is damaged ({why}); "
                            "move the damaged ones away to start over here, or pass train.resume=<checkpoint>")
        if ckpt is None:
            return None
        refuse_foreign(run_dir, ckpt.state.get("run_id"), rid, ckpt.path)
        if passed:
            set_aside(passed, ckpt, main)
        return ckpt
    if not loop.resume:
        return None
    try:
        return load_checkpoint(loop.resume)
    except UserError as e:
        raise UserError(f"train.resume: {str(e).removeprefix('ckpt: ')}") from e


DAMAGED = ".damaged-"


def set_aside(passed: list[tuple[int, Path, str]], ckpt: Checkpoint, main: bool) -> None:
    """Rename each damaged checkpoint newer than ``ckpt`` to ``step_N.damaged-<time>`` (no
    listing, rotation or recovery touches such a name), and say how far the resume falls back."""
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    for step, q, why in passed:
        aside = q.with_name(f"{q.name}{DAMAGED}{stamp}")
        if main:
            q.rename(aside)
        console.out.print(f"train.resume: {q} is damaged ({why}); set aside as {aside.name}", style="yellow")
    step = ckpt.state.get("step")
    back = f"{passed[0][0] - step:,} steps" if isinstance(step, int) else "some steps"
    console.out.print(f"train.resume: resuming from {ckpt.path}, {back} before the newest checkpoint "
                      f"(step {passed[0][0]:,}); those steps are trained again", style="yellow")


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


@dataclass
class RunRecord:
    """What every checkpoint of a run records besides the parts' state: what built it, where
    its data came from, and how many to keep."""

    run_dir: Path
    run_id: str
    spec: dict
    config: Mapping[str, Any]
    tokenizer_path: Path
    data: dict  # data_key, eos, bytes_per_token of the prepared data
    weight_names: dict
    keep: int
    token_counts: Callable[[], Any]


def _load(load: Callable[[Any], Any], state, what: str, ckpt: Checkpoint) -> None:
    """``load(state)`` (a part's ``load_state_dict``); a state a hand or a bad disk changed (a
    string where a number belongs, a list for a mapping) is one line naming the checkpoint and
    the part."""
    try:
        load(state)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RuntimeError, OverflowError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise UserError(f"train.resume: {ckpt.path} holds a damaged {what}: {reason}; resume from another "
                        "checkpoint, or start over with train.resume=null") from None


def restore(parts: Parts, ckpt: Checkpoint, dist, weights_only_ok: bool) -> None:
    """Everything that decides the next step, from ``ckpt``: each stateful part from its slot
    (`llmlab.train.parts.Slot`); ``weights_only_ok``: a checkpoint without trainer.pt continues
    from its weights with a fresh optimizer and random state."""
    state = ckpt.trainer_state()
    if state is None:
        if not weights_only_ok:
            raise UserError(f"train.resume: {ckpt.path} has no trainer.pt (optimizer and random state), so the run "
                            "cannot continue its curve; pass train.resume_weights_only=true to continue from its "
                            "weights with a fresh optimizer, or train.resume=null to start over")
        console.out.print(f"resuming from the weights of {ckpt.path} alone: fresh optimizer and random state, so "
                          "the curve differs from an uninterrupted run", style="yellow")
        state = {}
    if not isinstance(state, dict):
        raise UserError(f"train.resume: {ckpt.path} holds a damaged trainer.pt: a {type(state).__name__}, not the "
                        "trainer's parts by name; resume from another checkpoint, or start over with train.resume=null")
    for name, part, where in parts.checkpointed(dist):
        if where.file == "trainer":
            if where.key in state:
                _load(part.load_state_dict, state[where.key], where.where(), ckpt)
        elif where.file == "ranks":
            _load_rank(part, where, state, dist.rank, ckpt)
        else:
            saved = ckpt.state if not where.key else ckpt.state.get(where.key)
            _load(part.load_state_dict, saved if where.default is None else (saved or where.default), where.where(),
                  ckpt)
    if parts.ema is not None:
        average = ckpt.ema_weights()
        if average is None and not weights_only_ok:
            raise UserError(f"train.ema: {ckpt.path} has no {EMA_FILE} (it was saved without train.ema), so the "
                            "average cannot continue; pass train.resume_weights_only=true to start the average "
                            "from its weights, or train.resume=null to start over")
        if average is not None:
            _load(parts.ema.load_state_dict, average, f"weight average ({EMA_FILE})", ckpt)
    ckpt.drop_trainer_state()
    console.out.print(f"resumed from {ckpt.path} at step {parts.progress.step}")


def _load_rank(part: Any, where: Slot, state: dict, rank: int, ckpt: Checkpoint) -> None:
    """This rank's entry of a ``ranks`` slot, where the checkpoint has one: a rank with no
    saved state of its own (more ranks than before) keeps its seed."""
    fields = where.split or ("",)
    lists = {f: state.get(where.key.format(f) if where.split else where.key) for f in fields}
    first = lists[fields[0]]
    if first is None:
        return

    def load(_) -> None:
        if not isinstance(first, list) or not all(isinstance(v, (list, type(None))) for v in lists.values()):
            raise ValueError(f"its {where.what}s by rank are " + ("not lists" if where.split else "not a list"))
        if rank < len(first):
            if where.split:
                part.load_state_dict({f: (v or [None] * len(first))[rank] for f, v in lists.items()})
            else:
                part.load_state_dict(first[rank])

    _load(load, None, where.where(), ckpt)


def save(parts: Parts, record: RunRecord, dist) -> Path | None:
    """Every rank calls this (FSDP gathers its shards, the log window's sums are averaged, each
    rank's random state is gathered); rank 0 writes, the others wait. Each stateful part goes
    to its slot (`llmlab.train.parts.Slot`); the log window's sums go in too, so a resumed run
    logs the same interval average as an uninterrupted one."""
    full = full_model_state(parts.model, dist)
    saved = parts.checkpointed(dist)
    own = {name: part.state_dict() for name, part, where in saved if where.file != "ranks"}
    by_rank = gather(tuple(part.state_dict() for _, part, where in saved if where.file == "ranks"), dist)
    path = None
    if dist.is_main:
        weights = {k: full[k] for k in record.weight_names}
        state_json: dict[str, Any] = {}
        trainer: dict[str, Any] = {}
        index = 0
        for name, part, where in saved:
            if where.file == "state" and not where.key:  # spread over state.json's top level
                state_json.update(own[name])
            elif where.file == "state":
                state_json[where.key] = own[name]
            elif where.file == "trainer":
                trainer[where.key] = own[name]
            else:
                values = [r[index] for r in by_rank]
                index += 1
                if where.split:
                    trainer.update({where.key.format(f): [v[f] for v in values] for f in where.split})
                else:
                    trainer[where.key] = values
        step = state_json.pop("step")
        path = save_checkpoint(
            record.run_dir / "checkpoints", step, weights, record.spec, record.config, record.tokenizer_path,
            state={**state_json, "run_id": record.run_id, "world_size": dist.world_size, **record.data},
            trainer_state=trainer, keep=record.keep, token_counts=record.token_counts(),
            ema=parts.ema.state_dict(weights) if parts.ema is not None else None)
    barrier(dist)
    return broadcast(path, dist)
