"""End-to-end runs that take minutes: `make test-all` runs them, `make test` does not."""

import json
import math

import pytest

from tests.conftest import run_cli


@pytest.mark.slow
def test_default_model_learns_the_stdlib(tmp_path):
    """The default config on the default corpus, shortened: validation loss falls well below
    chance (ln 8192 = 9.0) and keeps falling between evals."""
    r = run_cli("train", "logger=none", "train.steps=150", "train.eval_every=75", "train.ckpt_every=0",
                "hydra.run.dir=run", cwd=tmp_path, timeout=1800)
    assert r.returncode == 0, r.stderr
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if "val/loss" in json.loads(line)]
    assert [e["step"] for e in evals] == [75, 150]
    assert evals[0]["val/loss"] < math.log(8192) - 2
    assert evals[1]["val/loss"] < evals[0]["val/loss"] - 0.2
    s = run_cli("sample", "ckpt=run", "prompt=def", "max_new_tokens=20", "temperature=0", cwd=tmp_path)
    assert s.returncode == 0, s.stderr
    assert s.stdout.startswith("def") and len(s.stdout) > len("def\n")


def _presets():
    from pathlib import Path

    from llmlab.paths import conf_dir
    return sorted(p.stem for p in (Path(conf_dir()) / "model").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("preset", _presets())
def test_every_preset_trains_from_the_cli(tmp_path, preset):
    """20 steps of each preset on a byte-level corpus: the training loss falls."""
    from tests.conftest import SAMPLE_TEXTS
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(SAMPLE_TEXTS.values()) * 8)
    r = run_cli("train", f"model={preset}", "data=text", f"data.paths={corpus}", "tokenizer=byte", "logger=none",
                "model.max_seq_len=64", "train.steps=20", "train.batch_size=8", "train.log_every=5",
                "train.eval_every=0", "train.eval_windows=4", "train.sample_tokens=4", "optim.lr=3e-3",
                "sched.warmup=5", "hydra.run.dir=run", cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr
    losses = [json.loads(line)["train/loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if "train/loss" in line]
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.5, losses


@pytest.mark.slow
def test_a_real_sweep_of_two_variants_and_two_seeds_reports_itself(tmp_path):
    """train -m over 2 attention kinds x 2 seeds compares them when it ends; llmlab report on the
    sweep directory then gives the same report."""
    from tests.conftest import SAMPLE_TEXTS
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(SAMPLE_TEXTS.values()) * 4)
    r = run_cli("train", "-m", "model/attention=mha,mqa", "seed=0,1", "data=text", f"data.paths=[{corpus}]",
                "tokenizer=byte", "logger=none", "model.d_model=64", "model.n_layers=2", "model.max_seq_len=64",
                "train.steps=60", "train.eval_every=20", "train.eval_windows=4", "train.batch_size=8",
                "hydra.sweep.dir=sweep", cwd=tmp_path, timeout=1800)
    assert r.returncode == 0, r.stderr
    own = json.loads((tmp_path / "sweep" / "report.json").read_text())  # written when the sweep ended
    assert own["baseline"] == "model/attention=mha" and "paired by seed against model/attention=mha" in r.stdout
    rep = run_cli("report", "sweep", "baseline=mha", "out=rep", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report == own
    groups = {g["group"]: g for g in report["groups"]}
    assert set(groups) == {"model/attention=mha", "model/attention=mqa"}
    assert all(g["seeds"] == 2 and g["val_loss_ci95"] is not None for g in groups.values())
    assert groups["model/attention=mqa"]["kv_cache_bytes_per_token"] < groups["model/attention=mha"]["kv_cache_bytes_per_token"]
    assert all(g["decode_tokens_per_s"] > 0 and g["train_tokens_per_s"] > 0 for g in groups.values())
    assert report["matched_tokens"] == 60 * 8 * 64
    (c,) = report["comparisons"]
    assert c["pairs"] == 2 and c["t_test_p"] is None  # two seeds: a difference, no p-value
    assert (tmp_path / "rep" / "report.png").stat().st_size > 10_000
