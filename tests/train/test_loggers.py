import json

import pytest

from llmlab.train.loggers import LOGGER, JsonlWriter, Logger, SafeLogger


class Exploding(Logger):
    def log(self, metrics, step):
        raise ConnectionError("network down")


def test_a_failing_logger_never_stops_the_run(capsys):
    cfg = LOGGER.config({"kind": "none"}, "logger")
    safe = SafeLogger(Exploding(cfg))
    safe.start("x", {})
    safe.log({"loss": 1.0}, 1)  # raises inside, swallowed
    safe.log({"loss": 0.5}, 2)  # switched off: not called again
    safe.finish()
    err = capsys.readouterr().err
    assert err.count("logging to it is off") == 1 and "network down" in err


def test_wandb_offline_run_receives_what_the_run_logged(corpus_dir, tmp_path, monkeypatch):
    """Every record of metrics.jsonl reaches wandb's public ``Run.log`` with the same values,
    the offline run finishes cleanly, and its run file is there for ``wandb sync``. (wandb's
    .wandb file is its own private format, and its service closes it after ``finish``
    returns: it is not read here.)"""
    import wandb
    from wandb.sdk.wandb_run import Run

    from llmlab.train.loop import run_training
    from tests.train.test_loop import config
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    sent: list[tuple[int, dict]] = []
    original = Run.log

    def spy(self, data, step=None, *args, **kwargs):
        sent.append((step, dict(data)))
        return original(self, data, step, *args, **kwargs)

    monkeypatch.setattr(Run, "log", spy)
    cfg = config(corpus_dir, tmp_path, steps=6, log_every=2, eval_every=3)
    cfg["logger"] = {"kind": "wandb", "project": "llmlab-test"}
    summary = run_training(cfg, tmp_path / "run")
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in logged if "train/loss" in r}
    assert sorted(train) == [2, 4, 6]
    for step, data in sent:
        if "train/loss" in data:  # each train record, every key, with the same value
            expected = train.pop(step)
            assert data["train/step"] == step
            for key in ("train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/mfu"):
                assert data[key] == pytest.approx(expected[key], rel=1e-6), key
    assert not train, f"steps never sent to wandb: {sorted(train)}"
    evals = {step: data["val/loss"] for step, data in sent if "val/loss" in data}
    assert evals == pytest.approx({r["step"]: r["val/loss"] for r in logged if "val/loss" in r})
    assert any("samples" in data for _, data in sent)
    assert sent[-1] == (6, {"summary/val_loss": summary["val_loss"], "train/step": 6})
    assert wandb.run is None  # finished, not left open
    assert len(list((tmp_path / "run").glob("wandb/offline-run-*/run-*.wandb"))) == 1


def test_jsonl_writer(tmp_path):
    w = JsonlWriter(tmp_path / "m.jsonl")
    w.write({"step": 1, "loss": 2.5})
    w.write({"step": 2, "loss": 2.0})
    w.close()
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rows] == [2.5, 2.0] and all("time" in r for r in rows)
