import json

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


def test_wandb_offline_writes_into_the_run_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = LOGGER.config({"kind": "wandb", "project": "llmlab-test"}, "logger")
    logger = SafeLogger(LOGGER.build(cfg))
    logger.start(tmp_path, {"seed": 1})
    logger.log({"train/loss": 2.0}, 1)
    logger.log_samples([("def ", "f(): pass")], 1)
    logger.finish()
    assert not logger.dead
    assert logger.inner.mode == "offline"
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_jsonl_writer(tmp_path):
    w = JsonlWriter(tmp_path / "m.jsonl")
    w.write({"step": 1, "loss": 2.5})
    w.write({"step": 2, "loss": 2.0})
    w.close()
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rows] == [2.5, 2.0] and all("time" in r for r in rows)
