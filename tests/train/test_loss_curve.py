"""A stored loss curve: one fixed command, trained through the CLI, must reproduce the train
losses kept in ``tests/assets/loss_curve.json``. It guards the defaults, the model, the data
path and the optimizer against a silent numerical drift: a change that moves this curve is a
change in what llmlab trains, and says so in its commit when it regenerates the file with

    python -m tests.train.test_loss_curve
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import SAMPLE_TEXTS, run_cli

ASSET = Path(__file__).resolve().parent.parent / "assets" / "loss_curve.json"
# Everything not named here is llmlab's default: the model's parts, the optimizer, the schedule.
COMMAND = ["train", "data=text", "data.paths=[c.txt]", "tokenizer=byte", "model.d_model=32", "model.n_layers=2",
           "model.n_heads=2", "model.max_seq_len=32", "train.batch_size=4", "train.steps=40", "train.log_every=1",
           "train.eval_every=0", "train.eval_windows=2", "train.sample_tokens=2", "train.prompts=[x]",
           "logger=none", "device=cpu", "seed=7", "hydra.run.dir=run"]
# CPU kernels differ in the last bits across torch builds and instruction sets; a real change
# (a default, an init, a schedule) moves the curve by far more than this.
TOLERANCE = 2e-3


def train_losses(root: Path) -> list[float]:
    """The command's train losses, through the CLI in this process (`run_cli`: the code a shell
    runs, without a second interpreter's 6 s of start-up), on one thread as the tests run."""
    import torch

    torch.set_num_threads(1)
    (root / "c.txt").write_text("".join(SAMPLE_TEXTS.values()) * 3, encoding="utf-8")
    done = run_cli(*COMMAND, cwd=root, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in records if "train/loss" in r]


def test_the_stored_loss_curve_is_reproduced(tmp_path):
    stored = json.loads(ASSET.read_text())
    assert stored["command"] == COMMAND, "the command changed: regenerate the curve and say why"
    losses = train_losses(tmp_path)
    assert len(losses) == len(stored["train_loss"]) == 40
    worst = max(abs(a - b) for a, b in zip(losses, stored["train_loss"]))
    assert worst < TOLERANCE, f"train loss moved by up to {worst:.2e} from the stored curve"
    assert losses[-1] < losses[0] - 1.0  # and it is a curve that learns


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        curve = train_losses(Path(d))
    ASSET.parent.mkdir(exist_ok=True)
    ASSET.write_text(json.dumps({"command": COMMAND, "train_loss": curve}, indent=1) + "\n")
    print(f"wrote {ASSET}: {len(curve)} losses, {curve[0]:.4f} -> {curve[-1]:.4f}", file=sys.stderr)
