"""A checkpoint's run state read back after a hand edit: a damaged part is one line that names
the checkpoint and the part, never a traceback or a silent default."""

from __future__ import annotations

import json

import pytest

from llmlab.errors import UserError
from llmlab.train.loop import run_training
from tests.conftest import write_corpus
from tests.train.test_loop import config


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


def test_a_hand_edited_optimizer_state_is_one_line_naming_it(tmp_path):
    """trainer.pt's optimizer state goes through the same one-line rule as the other parts."""
    import torch

    corpus = write_corpus(tmp_path)
    run_training(config(corpus, tmp_path, steps=2, eval_every=0, ckpt_every=2), tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    trainer = torch.load(ckpt / "trainer.pt", weights_only=True)
    trainer["optimizer"]["param_groups"] = []  # as if a hand removed them
    torch.save(trainer, ckpt / "trainer.pt")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["trainer.pt"] = (ckpt / "trainer.pt").stat().st_size
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    line = rf"^train.resume: {ckpt} holds a damaged optimizer state \(trainer\.pt\): .+; resume from another checkpoint"
    with pytest.raises(UserError, match=line):
        run_training(config(corpus, tmp_path, steps=4, eval_every=0, resume=str(ckpt)), tmp_path / "again")
