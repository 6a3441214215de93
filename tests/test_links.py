"""No write follows a link out of a folder llmlab did not just create (`llmlab.files`,
`llmlab.hydra_files`): for every file a command writes into a run, sweep, eval or report
folder, a link planted under its name to a file outside is replaced or refused in one line,
and the outside file keeps every byte."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from llmlab.errors import UserError
from llmlab.files import atomic_write_text, open_append, own_dir, release
from tests.conftest import run_cli, the_error_line, write_corpus

TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=32", "tokenizer=byte",
        "logger=none", "train.batch_size=2", "train.log_every=1", "train.eval_windows=2", "train.sample_tokens=4",
        "train.prompts=[x]", "train.eval_every=3", "train.ckpt_every=3"]
VICTIM = b"a file outside the run: keep every byte\n"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A folder with the corpus, a tiny run stopped at step 4 of 6 (`run`), a finished sweep
    of two jobs (`sweep`), an eval (`eval`) and a report (`report`) of the run."""
    root = tmp_path_factory.mktemp("links")
    write_corpus(root)
    r = run_cli("train", *data(root), *TINY, "train.steps=6", "train.max_steps=4", "hydra.run.dir=run", cwd=root)
    assert r.returncode == 0, r.stderr
    r = run_cli("train", "-m", *data(root), *TINY, "train.steps=3", "train.eval_every=0", "seed=1,2",
                "hydra.sweep.dir=sweep", cwd=root)
    assert r.returncode == 0, r.stderr
    for args in (["eval", "ckpt=run", "max_batches=2", "hydra.run.dir=eval"], ["report", "run", "out=report"],
                 ["sample", "ckpt=run", "prompt=x", "max_new_tokens=2", "hydra.run.dir=sample"]):
        r = run_cli(*args, cwd=root)
        assert r.returncode == 0, r.stderr
    return root


def data(root: Path) -> list[str]:
    return ["data=text", f"data.paths=[{root / 'corpus'}/*]"]


def case(base: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of ``base`` in ``tmp_path/work`` and a victim file beside it, outside it."""
    work = tmp_path / "work"
    shutil.copytree(base, work, symlinks=True)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    return work, victim


def plant(path: Path, target: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.symlink_to(target)


def replaced(result, path: Path, victim: Path) -> None:
    """The command ended well, said that it replaced the link at ``path``, left the victim as it
    was, and wrote a file of its own there."""
    assert result.returncode == 0, result.stderr
    assert victim.read_bytes() == VICTIM
    said = [line for line in (result.stdout + result.stderr).splitlines() if "was a link" in line]
    assert any(str(path.name) in line and str(victim) in line for line in said), said
    assert not path.is_symlink() and (path.is_file() or path.name == ".lock.pid")  # the lock's note goes with it


def refused(result, victim_dir: Path, *fragments: str) -> str:
    assert result.returncode != 0 and "Traceback" not in result.stderr
    line = the_error_line(result.stderr)
    assert line is not None, result.stderr
    for fragment in fragments:
        assert fragment in line, line
    assert list(victim_dir.iterdir()) == [], "something was written into the folder a link led to"
    return line


@pytest.mark.parametrize("name", [".hydra/overrides.yaml", ".hydra/config.yaml", ".hydra/hydra.yaml", "config.yaml",
                                  "train.log", "metrics.jsonl", "summary.json", "samples.jsonl", ".lock",
                                  ".lock.pid"])
def test_a_resumed_run_replaces_a_planted_link(base, tmp_path, name):
    work, victim = case(base, tmp_path)  # the copy names the base's corpus, as the run it resumes did
    plant(work / "run" / name, victim)
    r = run_cli("train", *data(base), *TINY, "train.steps=6", "hydra.run.dir=run", cwd=work)
    replaced(r, work / "run" / name, victim)
    assert "checkpoints/step_000006" in r.stdout


def test_a_refused_command_writes_through_no_link_either(base, tmp_path):
    """Another config in the run's directory is refused, after Hydra wrote its files: those
    went to files of their own."""
    work, victim = case(base, tmp_path)
    plant(work / "run" / ".hydra" / "overrides.yaml", victim)
    r = run_cli("train", *data(base), *TINY, "train.steps=6", "hydra.run.dir=run", "model.d_model=64", cwd=work)
    assert r.returncode != 0 and the_error_line(r.stderr) is not None, r.stderr
    assert victim.read_bytes() == VICTIM
    assert "model.d_model=64" in (work / "run" / ".hydra" / "overrides.yaml").read_text()


@pytest.mark.parametrize("folder,key", [("run", "hydra.run.dir"), ("run/.hydra", "hydra.run.dir"),
                                        ("run/checkpoints", "run/checkpoints")])
def test_a_folder_that_links_out_is_refused_before_anything_is_written(base, tmp_path, folder, key):
    work, _ = case(base, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    plant(work / folder, outside)
    r = run_cli("train", *data(base), *TINY, "train.steps=6", "hydra.run.dir=run", cwd=work)
    refused(r, outside, key, "is a link out of its folder", str(outside))


@pytest.mark.parametrize("name", ["eval.json", "per_position.json", "per_position.png", "eval.log"])
def test_eval_into_a_run_directory_replaces_a_planted_link(base, tmp_path, name):
    work, victim = case(base, tmp_path)
    plant(work / "eval" / name, victim)
    replaced(run_cli("eval", "ckpt=run", "max_batches=2", "hydra.run.dir=eval", cwd=work), work / "eval" / name,
             victim)


@pytest.mark.parametrize("name", ["samples.jsonl", "sample.log"])
def test_sample_into_a_run_directory_replaces_a_planted_link(base, tmp_path, name):
    work, victim = case(base, tmp_path)
    plant(work / "sample" / name, victim)
    r = run_cli("sample", "ckpt=run", "prompt=x", "max_new_tokens=2", "hydra.run.dir=sample", cwd=work)
    replaced(r, work / "sample" / name, victim)


@pytest.mark.parametrize("name", ["report.md", "report.json", "report.png"])
def test_report_into_its_out_folder_replaces_a_planted_link(base, tmp_path, name):
    work, victim = case(base, tmp_path)
    plant(work / "report" / name, victim)
    replaced(run_cli("report", "run", "out=report", cwd=work), work / "report" / name, victim)


def test_a_report_folder_that_links_out_is_refused(base, tmp_path):
    work, _ = case(base, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    plant(work / "report", outside)
    refused(run_cli("report", "run", "out=report", cwd=work), outside, "out:", "is a link out of its folder")


@pytest.mark.parametrize("name", ["multirun.yaml", "report.md", "0_seed=1/.hydra/overrides.yaml",
                                  "1_seed=2/train.log"])
def test_the_same_sweep_again_replaces_a_planted_link(base, tmp_path, name):
    work, victim = case(base, tmp_path)
    plant(work / "sweep" / name, victim)
    r = run_cli("train", "-m", *data(base), *TINY, "train.steps=3", "train.eval_every=0", "seed=1,2",
                "hydra.sweep.dir=sweep", cwd=work)
    replaced(r, work / "sweep" / name, victim)


def test_an_export_target_that_links_out_is_refused(base, tmp_path):
    work, _ = case(base, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (work / "hf").symlink_to(outside)
    refused(run_cli("export", "ckpt=run", "out=hf", cwd=work), outside, "out:", "is a link out of its folder")


# -- the rule itself, on each kind of name a writer may meet ---------------------------------------
def test_a_whole_file_write_replaces_a_symbolic_or_hard_link_and_keeps_the_mode(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "soft").symlink_to(victim)
    os.link(victim, folder / "hard")
    for name in ("soft", "hard", "plain"):
        atomic_write_text(folder / name, "new\n")
        assert (folder / name).read_text() == "new\n" and not (folder / name).is_symlink()
        assert os.stat(folder / name).st_nlink == 1
    assert victim.read_bytes() == VICTIM
    umask = os.umask(0)
    os.umask(umask)
    assert (folder / "plain").stat().st_mode & 0o777 == 0o666 & ~umask  # as a plain open makes it
    assert sorted(p.name for p in folder.iterdir()) == ["hard", "plain", "soft"]  # no temporary left


def test_an_append_never_follows_a_link_and_keeps_a_plain_file(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    (tmp_path / "log").write_text("old\n")
    (tmp_path / "soft").symlink_to(victim)
    os.link(victim, tmp_path / "hard")
    for name in ("log", "soft", "hard", "new"):
        with open_append(tmp_path / name) as f:
            f.write("more\n")
    assert (tmp_path / "log").read_text() == "old\nmore\n"
    for name in ("soft", "hard", "new"):
        assert (tmp_path / name).read_text() == "more\n" and not (tmp_path / name).is_symlink()
    assert victim.read_bytes() == VICTIM
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(UserError, match="pipe: not a regular file"):
        open_append(tmp_path / "pipe")


def test_own_dir_refuses_only_a_link_out_of_its_parent(tmp_path):
    (tmp_path / "inside").mkdir()
    (tmp_path / "outside").mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "real").mkdir()
    (run / "near").symlink_to(run / "real")  # stays inside the run: a user's own arrangement
    (run / "far").symlink_to(tmp_path / "outside")
    assert own_dir(run / "near") == run / "near"
    assert own_dir(run / "new" / "deeper").is_dir()
    with pytest.raises(UserError, match=r"key: .*far is a link out of its folder"):
        own_dir(run / "far", "key")


def test_release_removes_only_links(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    (tmp_path / "plain").write_text("mine")
    (tmp_path / "soft").symlink_to(victim)
    for name in ("plain", "soft", "missing"):
        release(tmp_path / name)
    assert (tmp_path / "plain").read_text() == "mine" and not (tmp_path / "soft").exists()
    assert victim.read_bytes() == VICTIM


@pytest.mark.parametrize("command,name", [
    (["tokenize", "tokenizer=byte", "hydra.run.dir=tk"], "tk/tokenize.json"),
    (["eval", "ckpt=run", "max_batches=1", "analysis=attention", "hydra.run.dir=ev"], "ev/attention.json"),
])
def test_the_other_commands_records_replace_a_planted_link(base, tmp_path, command, name):
    """tokenize's record of the shards and the attention analysis's results, written into a
    folder that holds a link under their name."""
    work, victim = case(base, tmp_path)
    (work / name).parent.mkdir()
    plant(work / name, victim)
    args = [*command, *data(base)] if command[0] == "tokenize" else command
    replaced(run_cli(*args, cwd=work), work / name, victim)
