"""A checkpoint's run state read back after a hand edit: a damaged part is one line that names
the checkpoint and the part, never a traceback or a silent default."""

from __future__ import annotations

import json

import pytest
import torch

from llmlab.errors import UserError
from llmlab.train.loop import run_training
from llmlab.train.optim import OPTIMIZER
from tests.conftest import write_corpus
from tests.helpers import config


@pytest.mark.parametrize("edit, part", [
    ({"log_window": {"loss": "xx", "micro": 1, "extra": {}}}, "log window"),
    ({"log_window": [1, 2]}, "log window"),
    ({"step": "four"}, "step count"),
    ({"val": [1.0]}, "step count"),
    ({"data_rng": {"bit_generator": "nope"}}, "data position"),
    # numpy's own state with one field past a C long (found by the fuzzer: an OverflowError)
    (lambda state: {"data_rng": {**state["data_rng"], "has_uint32": 2 ** 70}}, "data position"),
], ids=["loss-text", "window-list", "step-text", "val-list", "data-rng", "data-rng-overflow"])
def test_a_hand_edited_run_state_is_one_line_naming_the_part(tmp_path, edit, part):
    corpus = write_corpus(tmp_path)
    run_training(config(corpus, tmp_path, steps=2, eval_every=0, ckpt_every=2), tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    state = json.loads((ckpt / "state.json").read_text())
    text = json.dumps({**state, **(edit(state) if callable(edit) else edit)})
    (ckpt / "state.json").write_text(text)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["state.json"] = len(text.encode())  # a careful hand keeps the manifest in step
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    line = rf"^train.resume: {ckpt} holds a damaged {part} \(state\.json[^)]*\): .+; resume from another checkpoint"
    with pytest.raises(UserError, match=line):
        run_training(config(corpus, tmp_path, steps=4, eval_every=0, resume=str(ckpt)), tmp_path / "again")


def _first_state(opt: dict) -> dict:
    return next(iter(opt["state"].values()))


def _last_state(opt: dict) -> dict:
    return list(opt["state"].values())[-1]


# each found by fuzzing trainer.pt's structure: the first two ended in a segmentation fault (the
# fused AdamW kernel read moments shaped for another parameter), the rest in a traceback
@pytest.mark.parametrize("edit", [
    lambda opt: opt.update(param_groups=[]),
    lambda opt: _first_state(opt).update(exp_avg=torch.tensor(float("inf"))),
    lambda opt: _first_state(opt).update(exp_avg_sq=-1),
    lambda opt: opt["param_groups"][0].update(betas=torch.tensor([0.0])),
    lambda opt: opt["param_groups"][0].update(differentiable=float("nan")),
    lambda opt: _first_state(opt).pop("exp_avg_sq"),
    lambda opt: _last_state(opt).pop("step"),
], ids=["groups-emptied", "moment-scalar", "moment-int", "betas-tensor", "flag-nan", "moment-deleted", "step-deleted"])
def test_a_hand_edited_optimizer_state_is_one_line_naming_it(tmp_path, edit):
    """trainer.pt's optimizer state goes through the same one-line rule as the other parts."""
    corpus = write_corpus(tmp_path)
    run_training(config(corpus, tmp_path, steps=2, eval_every=0, ckpt_every=2), tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    trainer = torch.load(ckpt / "trainer.pt", weights_only=True)
    edit(trainer["optimizer"])
    torch.save(trainer, ckpt / "trainer.pt")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["trainer.pt"] = (ckpt / "trainer.pt").stat().st_size
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    line = rf"^train.resume: {ckpt} holds a damaged optimizer state \(trainer\.pt\): .+; resume from another checkpoint"
    with pytest.raises(UserError, match=line):
        run_training(config(corpus, tmp_path, steps=4, eval_every=0, resume=str(ckpt)), tmp_path / "again")


@pytest.mark.parametrize("kind", OPTIMIZER.names())
def test_every_optimizers_own_checkpoint_passes_the_state_checks(tmp_path, kind):
    """The checks on a loaded optimizer state refuse no state an optimizer saved itself
    (Adafactor's factored moments and negative beta2_decay, Muon's coefficients, SGD's momentum)."""
    corpus = write_corpus(tmp_path)

    def cfg(**train):
        c = config(corpus, tmp_path, eval_every=0, log_every=1, **train)
        c["optim"] = {"kind": kind, "lr": 3e-3}
        return c

    first = run_training(cfg(steps=2, ckpt_every=2), tmp_path / "run")
    again = run_training(cfg(steps=3, resume=str(tmp_path / "run" / "checkpoints" / "step_000002")), tmp_path / "again")
    assert first["steps"] == 2 and again["steps"] == 3
    logged = [json.loads(line)["step"] for line in (tmp_path / "again" / "metrics.jsonl").read_text().splitlines()
              if "train/loss" in line]
    assert logged == [3]  # resumed at step 2: only step 3 was trained


@pytest.mark.parametrize("edit, part", [
    (lambda t: t.update(torch_rng_by_rank=-1), "random state"),
    (lambda t: t.update(mask_rng_by_rank=[]), "random state"),
    (lambda t: [], "trainer.pt"),
], ids=["rng-int", "masks-short", "not-a-mapping"])
def test_a_hand_edited_trainer_state_is_one_line_naming_the_part(tmp_path, edit, part):
    """The per-rank random states and trainer.pt as a whole (found by fuzzing its structure:
    a TypeError traceback from len() of an int)."""
    corpus = write_corpus(tmp_path)
    run_training(config(corpus, tmp_path, steps=2, eval_every=0, ckpt_every=2), tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    trainer = torch.load(ckpt / "trainer.pt", weights_only=True)
    edited = edit(trainer)
    torch.save(trainer if edited is None else edited, ckpt / "trainer.pt")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["trainer.pt"] = (ckpt / "trainer.pt").stat().st_size
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match=rf"^train.resume: {ckpt} holds a damaged {part}.*; resume from another"):
        run_training(config(corpus, tmp_path, steps=4, eval_every=0, resume=str(ckpt)), tmp_path / "again")


def test_a_new_stateful_part_is_saved_and_restored_by_its_slot_alone(tmp_path, monkeypatch):
    """A part added to `Parts` with a `Slot` is saved by resume into that slot and restored from
    it, with no edit of resume: one in state.json, one in trainer.pt, one by rank; a slot's
    ``saved_as`` stands in for its part (as the optimizer's whole state does) or leaves it out
    of this run's checkpoints (as a loss scaler that does not scale)."""
    from dataclasses import dataclass
    from typing import Any

    import llmlab.train.loop as loop
    from llmlab.train.parts import Parts, Slot, slot

    loaded: list[tuple[str, Any]] = []

    class Counter:
        def __init__(self, name: str) -> None:
            self.name = name

        def state_dict(self) -> dict:
            return {"seen": 7, "by": self.name}

        def load_state_dict(self, state: dict) -> None:
            loaded.append((self.name, state))

    @dataclass(frozen=True)
    class MoreParts(Parts):
        tally: Any = slot(Slot("state", "tally", "tally"), default_factory=lambda: Counter("tally"))
        ledger: Any = slot(Slot("trainer", "ledger", "ledger"), default_factory=lambda: Counter("ledger"))
        beads: Any = slot(Slot("ranks", "beads_by_rank", "beads"), default_factory=lambda: Counter("beads"))
        shown: Any = slot(Slot("trainer", "shown", "shown", saved_as=lambda part, parts, dist: Counter("stand-in")),
                          default_factory=lambda: Counter("shown"))
        idle: Any = slot(Slot("trainer", "idle", "idle", saved_as=lambda part, parts, dist: None),
                         default_factory=lambda: Counter("idle"))

    monkeypatch.setattr(loop, "Parts", MoreParts)
    corpus = write_corpus(tmp_path)
    run_training(config(corpus, tmp_path, steps=2, eval_every=0, ckpt_every=2), tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    assert json.loads((ckpt / "state.json").read_text())["tally"] == {"seen": 7, "by": "tally"}
    trainer = torch.load(ckpt / "trainer.pt", weights_only=True)
    assert trainer["ledger"] == {"seen": 7, "by": "ledger"} and trainer["beads_by_rank"] == [{"seen": 7, "by": "beads"}]
    assert trainer["shown"] == {"seen": 7, "by": "stand-in"} and "idle" not in trainer
    assert loaded == []
    run_training(config(corpus, tmp_path, steps=4, eval_every=0, resume=str(ckpt)), tmp_path / "again")
    assert sorted(loaded) == [(name, {"seen": 7, "by": name}) for name in ("beads", "ledger", "stand-in", "tally")]
