import json
import struct
from pathlib import Path

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


def wandb_history(run_dir: Path, kinds: list | None = None) -> list[dict]:
    """The history rows of the one offline wandb run under ``run_dir``, read from its .wandb
    file: a 7-byte header, then 32 KiB blocks of log records (crc32, length, type: FULL=1,
    FIRST=2, MIDDLE=3, LAST=4), each a wandb Record protobuf. ``kinds`` collects every
    record's type, to show what the file held when a check fails."""
    from wandb.proto import wandb_internal_pb2 as pb
    (path,) = list(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    rows, pos, parts = [], 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (kind == 0 and length == 0):  # the rest of a block is padding
            pos += left
            continue
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            parts = b""
            if kinds is not None:
                kinds.append(record.WhichOneof("record_type"))
            if record.WhichOneof("record_type") == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_wandb_offline_history_holds_what_the_run_logged(corpus_dir, tmp_path, monkeypatch):
    from llmlab.train.loop import run_training
    from tests.train.test_loop import config
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = config(corpus_dir, tmp_path, steps=6, log_every=2, eval_every=3)
    cfg["logger"] = {"kind": "wandb", "project": "llmlab-test"}
    run_training(cfg, tmp_path / "run")
    kinds: list = []
    rows = wandb_history(tmp_path / "run", kinds)
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in logged if "train/loss" in r}
    assert sorted(train) == [2, 4, 6]
    for row in rows:
        if "train/loss" in row:  # each train record, every key, with the same value
            expected = train.pop(row["_step"])
            for key in ("train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/mfu"):
                assert row[key] == pytest.approx(expected[key], rel=1e-6), key
    assert not train, f"steps missing from the wandb history; its records: {kinds}"
    evals = {r["_step"]: r["val/loss"] for r in rows if "val/loss" in r}
    assert evals == pytest.approx({r["step"]: r["val/loss"] for r in logged if "val/loss" in r})
    assert any(k.startswith("samples") for r in rows for k in r)


def test_jsonl_writer(tmp_path):
    w = JsonlWriter(tmp_path / "m.jsonl")
    w.write({"step": 1, "loss": 2.5})
    w.write({"step": 2, "loss": 2.0})
    w.close()
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rows] == [2.5, 2.0] and all("time" in r for r in rows)
