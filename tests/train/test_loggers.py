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
    from tests.helpers import config
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


def test_truncate_after_keeps_the_earlier_records_and_sets_damaged_lines_aside(tmp_path, capsys):
    """A resume drops the records after its step. A line that is not a JSON record (bytes that
    are not UTF-8, a list, a step that is not a number) is left out with a warning naming the
    line, and the file as it was is kept beside it; a last line a crash cut short goes quietly."""
    path = tmp_path / "metrics.jsonl"
    original = (b'{"step": 1, "loss": 2.5}\n\xff\xfe not utf-8\n[1, 2]\n{"step": "two"}\n'
                b'{"step": 2, "loss": 2.0}\n{"step": 3, "loss": 1.5}\n{"step": 4, "lo')
    path.write_bytes(original)
    records = JsonlWriter.truncate_after(path, 2)
    assert [r["step"] for r in records] == [1, 2]
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    assert (tmp_path / "metrics.jsonl.damaged").read_bytes() == original
    err = capsys.readouterr().err
    assert "3 line(s) that are not JSON records (line 2, 3, 4) are left out" in " ".join(err.split())
    # a clean file with a cut last line: no warning, nothing set aside
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(b'{"step": 1}\n{"step": 2}\n{"st')
    assert [r["step"] for r in JsonlWriter.truncate_after(clean, 5)] == [1, 2]
    assert not (tmp_path / "clean.jsonl.damaged").exists() and "not JSON records" not in capsys.readouterr().err


@pytest.mark.parametrize("env_mode, mode, said", [
    ("disabled", "disabled", "wandb: disabled, nothing is logged to it"),  # auto wrote an offline run over it
    ("dryrun", "offline", "wandb: offline run"),
    # wandb's Settings refused it, and the run logged nothing to wandb
    ("garbage", "offline", "wandb: WANDB_MODE='garbage' is not a mode wandb knows"),
])
def test_auto_follows_wandb_mode_and_a_value_wandb_refuses_is_said(tmp_path, monkeypatch, capsys, env_mode, mode,
                                                                   said):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", env_mode)
    logger = LOGGER.build(LOGGER.config({"kind": "wandb", "project": "llmlab-test"}, "logger"))
    logger.start(tmp_path, {})
    try:
        assert logger.mode == mode
        logger.log({"train/loss": 1.0}, 1)
    finally:
        logger.finish()
    assert said in " ".join(capsys.readouterr().err.split())
