"""A run directory or a checkpoint from elsewhere is data, never instructions; a user's
mistake is one line, never a traceback. Each case here was once a leak or a traceback."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import check_cli, run_cli
from tests.helpers import TINY, one_line_error, train_a_tiny_run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """test_cli's tiny run, made in this process (test_cli makes it in real processes)."""
    return train_a_tiny_run(tmp_path_factory, process=False)


def copy_checkpoint(trained, tmp_path: Path) -> Path:
    from llmlab.train.checkpoint import list_checkpoints
    root, _ = trained
    src = list_checkpoints(root / "outputs" / "run" / "checkpoints")[-1]
    dst = tmp_path / "downloaded"
    shutil.copytree(src, dst)
    return dst


def test_report_never_resolves_what_a_run_directory_says(trained, tmp_path):
    root, _ = trained
    shared = tmp_path / "shared"
    for i, lr in enumerate(["${oc.env:LLMLAB_TEST_SECRET}", "0.001"]):
        run = shared / str(i)
        shutil.copytree(root / "outputs" / "run", run, ignore=shutil.ignore_patterns("checkpoints"))
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"optim.lr={lr}"]))
    r = run_cli("report", str(shared), f"out={tmp_path / 'out'}", cwd=tmp_path,
                env={"LLMLAB_TEST_SECRET": "hunter2-secret"})
    assert r.returncode == 0, r.stderr
    written = "".join((tmp_path / "out" / f).read_text() for f in ("report.md", "report.json"))
    for text in (r.stdout, r.stderr, written):
        assert "hunter2" not in text
    assert "optim.lr=${oc.env:LLMLAB_TEST_SECRET}" in written  # shown as the literal text it is


@pytest.mark.parametrize("bad, fragment", [
    ("overrides.yaml", "overrides.yaml is not a list of overrides"),
    ("overrides-syntax", "overrides.yaml is not readable YAML"),
    ("summary", "val_loss is 'low', not a number"),
    ("summary-list", "summary.json holds a JSON list, not an object"),
    ("summary-size", "params_non_embedding is 'lots', not a number"),  # the scaling fit's N
    ("summary-tokens", "tokens is -5; it must be > 0"),  # and its D
    ("summary-seed", "seed is {'a': 1}, not a number or a name"),  # runs are paired by it
])
def test_report_of_a_damaged_run_directory_is_one_line(trained, tmp_path, bad, fragment):
    root, _ = trained
    run = tmp_path / "run"
    shutil.copytree(root / "outputs" / "run", run, ignore=shutil.ignore_patterns("checkpoints"))
    summary = json.loads((run / "summary.json").read_text())
    if bad == "overrides.yaml":
        (run / ".hydra" / "overrides.yaml").write_text("{a: 1}\n")
    elif bad == "overrides-syntax":
        (run / ".hydra" / "overrides.yaml").write_text("- [unclosed\n")
    elif bad == "summary":
        (run / "summary.json").write_text(json.dumps({**summary, "val_loss": "low"}))
    elif bad == "summary-size":
        (run / "summary.json").write_text(json.dumps({**summary, "params_non_embedding": "lots"}))
    elif bad == "summary-tokens":
        (run / "summary.json").write_text(json.dumps({**summary, "tokens": -5}))
    elif bad == "summary-seed":
        (run / "summary.json").write_text(json.dumps({**summary, "seed": {"a": 1}}))
    else:
        (run / "summary.json").write_text("[1, 2]")
    one_line_error(run_cli("report", str(run), cwd=tmp_path), 1, fragment)


def test_eval_never_opens_a_file_a_checkpoint_names(trained, tmp_path):
    """A downloaded checkpoint whose config names a local file, with no cache entry here:
    eval asks for the data in one line, and nothing of the file reaches the cache."""
    ckpt = copy_checkpoint(trained, tmp_path)
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY " * 200)
    config = yaml.safe_load((ckpt / "config.yaml").read_text())
    config["data"] = {"kind": "text", "paths": [str(secret)], "val_fraction": 0.5}
    (ckpt / "config.yaml").write_text(yaml.safe_dump(config))
    state = json.loads((ckpt / "state.json").read_text())
    for key in ("no-such-entry", "../../../../etc"):  # absent, and a key that walks out of the cache
        (ckpt / "state.json").write_text(json.dumps({**state, "data_key": key}))
        _rewrite_manifest(ckpt)
        r = run_cli("eval", f"ckpt={ckpt}", cwd=tmp_path)
        one_line_error(r, 1, "data: ", "pass data=text")
    assert not (tmp_path / ".cache").exists() or not any((tmp_path / ".cache").iterdir())
    # named on the command line, the same file is the user's choice
    r = run_cli("eval", f"ckpt={ckpt}", "data=text", f"data.paths=[{secret}]", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def _rewrite_manifest(ckpt: Path) -> None:
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"] = {f: (ckpt / f).stat().st_size for f in manifest["files"]}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage, fragment", [
    ("state-list", "state.json holds a JSON list, not an object"),
    ("vocab", "its tokenizer.json has"),
    ("regex", "the tokenizer failed on this text"),
    # model.json edited, its manifest rewritten to agree (a crafted or hand-edited checkpoint)
    ("model-list", "model.json: model must be a mapping of settings"),
    ("attention-string", "model.json: attention must be a mapping of settings"),
    ("objective-list", "model.json: objective must be a mapping of settings"),
    ("vocab-text", "model.json: vocab_size must be a positive integer"),
    ("step", "is named for step 6 but its state.json records step 2"),
])
def test_a_damaged_or_hostile_checkpoint_is_one_line(trained, tmp_path, damage, fragment):
    ckpt = copy_checkpoint(trained, tmp_path)
    if damage == "state-list":
        (ckpt / "state.json").write_text("[]")
    elif damage == "vocab":  # a tokenizer with more ids than the model embeds
        from llmlab.data.tokenizer import TOKENIZER
        factory = TOKENIZER.build(TOKENIZER.config({"kind": "bpe", "vocab_size": 400}, "tokenizer"))
        factory.make(lambda: iter([["some text to learn from " * 50, "abcdefghijklmnopqrstuvwxyz" * 20]])).save(
            ckpt / "tokenizer.json")
    elif damage in ("model-list", "attention-string", "objective-list", "vocab-text"):
        spec = json.loads((ckpt / "model.json").read_text())
        field, value = {"model-list": ("model", [1, 2]), "attention-string": ("attention", "mha"),
                        "objective-list": ("objective", []), "vocab-text": ("vocab_size", "big")}[damage]
        spec[field] = value
        (ckpt / "model.json").write_text(json.dumps(spec))
    elif damage == "step":  # a step_000006 that holds step 2
        ckpt = ckpt.rename(tmp_path / "step_000006")
        state = json.loads((ckpt / "state.json").read_text())
        (ckpt / "state.json").write_text(json.dumps({**state, "step": 2}))
    else:  # a pre-tokenizer regex that exhausts the regex engine's retry limit
        tok = json.loads((ckpt / "tokenizer.json").read_text())
        tok["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a|aa)+b"}, "behavior": "Isolated",
                                "invert": False}
        (ckpt / "tokenizer.json").write_text(json.dumps(tok))
    _rewrite_manifest(ckpt)
    prompt = "a" * 5000 if damage == "regex" else "x"
    one_line_error(run_cli("sample", f"ckpt={ckpt}", f"prompt={prompt}", "max_new_tokens=2", cwd=tmp_path), 1,
                   fragment)
    if damage != "regex":
        one_line_error(run_cli("eval", f"ckpt={ckpt}", cwd=tmp_path), 1, fragment)


def test_resume_with_another_tokenizer_is_refused(trained, tmp_path):
    from tests.conftest import write_corpus
    root, _ = trained
    corpus = write_corpus(tmp_path)
    ckpt = copy_checkpoint(trained, tmp_path)
    args = [a for a in TINY if a != "tokenizer=byte"]
    r = run_cli("train", "data=text", f"data.paths=[{corpus}/*]", *args, "tokenizer=bpe", "tokenizer.vocab_size=300",
                f"train.resume={ckpt}", "train.steps=8", cwd=tmp_path)
    one_line_error(r, 2, "tokenizer: this run's tokenizer", str(ckpt))


@pytest.mark.parametrize("args, code, fragment", [
    (["device=banana"], 2, "device: unknown device 'banana'"),
    (["device=cuda"], 2, "device: cuda was asked for"),
    (["data=text", "data.paths=[]"], 2, "data.paths: no files given"),
    (["optim.lr=inf"], 2, "optim.lr: must be a finite number"),
    (["optim.lr=nan"], 2, "optim.lr: must be a finite number"),
])
def test_config_mistakes_exit_2_and_create_no_run_directory(tmp_path, args, code, fragment):
    import torch
    if args == ["device=cuda"] and torch.cuda.is_available():
        args, fragment = ["device=cuda:99"], "device"
    r = check_cli("train", *TINY, *args, cwd=tmp_path)  # the checks, in-process (see test_cli for a shell case)
    one_line_error(r, code, fragment)
    assert not (tmp_path / "outputs").exists()


def test_a_corpus_of_empty_files_is_refused(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("")
    r = run_cli("tokenize", "data=text", f"data.paths=[{tmp_path}/*.txt]", "tokenizer=byte", cwd=tmp_path)
    one_line_error(r, 1, "the corpus is empty", "hold no text")
    assert not (tmp_path / ".cache").exists() or not [p for p in (tmp_path / ".cache").iterdir()
                                                         if not p.name.startswith(".")]


def test_a_prompt_file_that_is_not_utf8(trained, tmp_path):
    root, _ = trained
    bad = tmp_path / "prompts.txt"
    bad.write_bytes(b"caf\xe9\n")
    r = run_cli("sample", f"ckpt={root / 'outputs' / 'run'}", f"prompt_file={bad}", cwd=tmp_path)
    one_line_error(r, 1, "prompt_file", "is not UTF-8")


def test_a_malformed_local_jsonl_dataset(tmp_path):
    bad = tmp_path / "corpus.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "broken\n')
    r = run_cli("tokenize", "data=hf", f"data.path={bad}", "tokenizer=byte", cwd=tmp_path)
    one_line_error(r, 1, "data.path: cannot load")


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_shard_with_ids_past_the_vocabulary_is_one_line(trained, tmp_path, split):
    """Bytes of the right size that decode to ids at or above the vocabulary (a damaged shard):
    one line naming the entry, before an embedding lookup fails (a device-side assert on CUDA)."""
    import numpy as np
    root, _ = trained
    cache = tmp_path / ".cache"
    shutil.copytree(root / ".cache", cache)
    (entry,) = [p for p in cache.iterdir() if (p / "meta.json").is_file()]
    shard = entry / split / "000000.bin"
    ids = np.fromfile(shard, dtype=np.uint16)
    ids[::7] = 65535  # every seventh id, so that every training batch meets one
    ids.tofile(shard)
    r = run_cli("train", "data=text", f"data.paths=[{root / 'corpus'}/*]", *TINY, "train.steps=2", cwd=tmp_path)
    one_line_error(r, 1, f"{entry} ({split} split) holds token id 65535, past the vocabulary", "delete")


@pytest.mark.parametrize("damage", ["deleted", "a folder"])
def test_a_cache_entry_without_its_meta_is_set_aside_and_prepared_again(trained, tmp_path, damage):
    """An entry whose meta.json is gone (or is a folder) is not an entry: it is moved aside
    under a name that says so, with a warning, and the data is prepared again."""
    root, _ = trained
    cache = tmp_path / ".cache"
    shutil.copytree(root / ".cache", cache)
    (entry,) = [p for p in cache.iterdir() if (p / "meta.json").is_file()]
    (entry / "meta.json").unlink()
    if damage == "a folder":
        (entry / "meta.json").mkdir()
    r = run_cli("tokenize", "data=text", f"data.paths=[{root / 'corpus'}/*]", "tokenizer=byte", cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    (aside,) = [p for p in cache.iterdir() if p.name.startswith(f".damaged-{entry.name}-")]
    assert f"cache entry {entry} has no readable meta.json: set aside as {aside}" in " ".join(r.stderr.split())
    assert (aside / "train" / "000000.bin").is_file()  # kept as it was
    assert (entry / "meta.json").is_file()  # prepared again


@pytest.mark.parametrize("progress, said", [
    ('{"tokenizer": tru', "it is unreadable (Expecting value"),
    ("[1, 2]", "it holds a JSON list, not an object"),
    ('{"tokenizer": "yes"}', "tokenizer is not true or false"),
    ('{"tokenizer": true, "splits": {"train": {"shards": 7}}}', "splits.train lacks its done flag or its list of shards"),
    # a shard's name is opened under the split's directory: a path there is refused
    ('{"tokenizer": true, "splits": {"train": {"done": false, "shards": [{"file": "../../x", "tokens": 1, '
     '"bytes": 1, "docs": 1, "crc32": 1, "position": 1}]}}}', "splits.train.shards[0].file is '../../x'"),
    ('{"tokenizer": true, "splits": {"train": {"done": false, "shards": [{"file": "000000.bin", "tokens": 1, '
     '"bytes": 1, "docs": 1, "crc32": 1, "position": 1, "repaired": "some"}]}}}',
     "splits.train.shards[0].repaired is 'some', not a count"),
])
def test_a_damaged_progress_json_sets_the_interrupted_build_aside_and_starts_again(trained, tmp_path, progress, said):
    """An interrupted preparation continues from its progress.json; one that is damaged or
    edited cannot be trusted with the files beside it, so they are moved aside, with a
    warning that names the field, and the data is prepared again (it was a traceback, or a
    build that went on from the edited record)."""
    root, _ = trained
    cache = tmp_path / ".cache"
    shutil.copytree(root / ".cache", cache)
    (entry,) = [p for p in cache.iterdir() if (p / "meta.json").is_file()]
    partial = cache / f".partial-{entry.name}"  # the entry as a killed build leaves it: no meta.json yet
    os.rename(entry, partial)
    (partial / "meta.json").unlink()
    (partial / "progress.json").write_text(progress)
    r = run_cli("tokenize", "data=text", f"data.paths=[{root / 'corpus'}/*]", "tokenizer=byte", cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    (aside,) = [p for p in cache.iterdir() if p.name.startswith(f".damaged-partial-{entry.name}-")]
    line = " ".join(r.stderr.split())
    assert f"an interrupted preparation of {entry.name} has a damaged progress.json ({said}" in line
    assert f"set aside as {aside}" in line
    assert (aside / "progress.json").read_text() == progress and (aside / "train" / "000000.bin").is_file()
    assert (entry / "meta.json").is_file() and not partial.exists()  # prepared again, from the start


@pytest.mark.parametrize("field, value, named", [
    ("timings.total_s", "x", "timings must be a mapping of seconds"),
    ("train.docs", "12", "train.docs must be a count"),
    ("val.tokens", -5, "val.tokens must be a count"),
    ("vocab_size", 0, "vocab_size must be a positive integer"),
    ("dtype", "float64", "dtype must be uint16 or uint32"),
    ("tokenizer_sample", {"bytes": "many"}, "tokenizer_sample must be null or a mapping"),
    ("train.shards", [{"file": "000000.bin"}], "train.shards must be a list of shards"),
    ("val.shards", [{"file": "000000.bin", "tokens": 1, "crc32": -1}], "val.shards must be shards whose crc32 is"),
    ("eos", 5, "eos must be a string or null"),
    ("eos", "<deleted>", "eos must be a string or null"),
    ("train.repaired", 1.5, "train.repaired must be a count"),
])
@pytest.mark.parametrize("command", ["tokenize", "train"])
def test_an_edited_cache_meta_is_one_line_naming_the_field(trained, tmp_path, field, value, named, command):
    root, _ = trained
    cache = tmp_path / ".cache"
    shutil.copytree(root / ".cache", cache)
    (entry,) = [p for p in cache.iterdir() if (p / "meta.json").is_file()]
    meta = json.loads((entry / "meta.json").read_text())
    *parents, last = field.split(".")
    node = meta
    for key in parents:
        node = node[key]
    if value == "<deleted>":
        del node[last]
    else:
        node[last] = value
    (entry / "meta.json").write_text(json.dumps(meta))
    data = ["data=text", f"data.paths=[{root / 'corpus'}/*]"]
    args = [*data, "tokenizer=byte"] if command == "tokenize" else [*data, *TINY, "train.steps=2"]
    r = run_cli(command, *args, cwd=tmp_path)
    one_line_error(r, 1, f"{entry / 'meta.json'}: {named}", "delete")


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_damaged_cache_shard_is_one_line(trained, tmp_path, damage):
    root, _ = trained
    cache = tmp_path / ".cache"
    shutil.copytree(root / ".cache", cache)
    (entry,) = [p for p in cache.iterdir() if (p / "meta.json").is_file()]
    shard = entry / "train" / "000000.bin"
    if damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:-3])
    else:
        shard.unlink()
    r = run_cli("train", "data=text", f"data.paths=[{root / 'corpus'}/*]", *TINY, "train.steps=2", cwd=tmp_path)
    one_line_error(r, 1, str(shard), "delete")


@pytest.mark.parametrize("split", ["train", "val"])
def test_tokenize_reads_every_shard_back_against_its_checksum(trained, tmp_path, split):
    """A byte flipped in place that still gives a valid id: the sizes agree and every id is in
    the vocabulary, so only the CRC-32 recorded when the shard was written tells. llmlab
    tokenize on the existing entry reads every shard back, says so, and names the changed one."""
    import numpy as np
    root, _ = trained
    cache = tmp_path / ".cache"
    shutil.copytree(root / ".cache", cache)
    (entry,) = [p for p in cache.iterdir() if (p / "meta.json").is_file()]
    args = ["data=text", f"data.paths=[{root / 'corpus'}/*]", "tokenizer=byte"]
    r = run_cli("tokenize", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "checksums: 2 shards read back and matching meta.json" in r.stdout
    shard = entry / split / "000000.bin"
    ids = np.fromfile(shard, dtype=np.uint16)
    ids[len(ids) // 2] = 97 if ids[len(ids) // 2] != 97 else 98  # "a" for another byte: still a valid id
    ids.tofile(shard)
    r = run_cli("tokenize", *args, cwd=tmp_path)
    one_line_error(r, 1, f"{shard} changed since it was written (CRC-32", "delete")


def test_a_shard_without_a_recorded_checksum_is_said_to_be_unchecked(trained, tmp_path):
    root, _ = trained
    cache = tmp_path / ".cache"
    shutil.copytree(root / ".cache", cache)
    (entry,) = [p for p in cache.iterdir() if (p / "meta.json").is_file()]
    meta = json.loads((entry / "meta.json").read_text())
    del meta["val"]["shards"][0]["crc32"]  # as an entry written before checksums
    (entry / "meta.json").write_text(json.dumps(meta))
    r = run_cli("tokenize", "data=text", f"data.paths=[{root / 'corpus'}/*]", "tokenizer=byte", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "checksums: 1 shard read back and matching meta.json" in r.stdout
    assert "1 from before checksums were recorded, not checked" in r.stdout


@pytest.mark.parametrize("damage, why", [
    ("truncated weights", "model.safetensors is truncated or corrupt"),
    ("trainer.pt edited, manifest agrees", "trainer.pt is unreadable"),
])
def test_a_resume_past_a_damaged_checkpoint_says_so_and_sets_it_aside(trained, tmp_path, damage, why):
    """A resume passes over a damaged newest checkpoint only aloud: it names it and why, sets
    it aside under a name that says so (its bytes kept), says how many steps it falls back,
    and trains those steps again into a new checkpoint beside it."""
    from llmlab.train.recovery import MANIFEST

    root, _ = trained
    run = tmp_path / "run"
    shutil.copytree(root / "outputs" / "run", run)
    latest = run / "checkpoints" / "step_000006"
    if damage == "truncated weights":
        f = latest / "model.safetensors"
        f.write_bytes(f.read_bytes()[:100])
    else:
        f = latest / "trainer.pt"
        f.write_bytes(b"not a zip archive at all")
        manifest = json.loads((latest / MANIFEST).read_text())
        manifest["files"]["trainer.pt"] = f.stat().st_size
        (latest / MANIFEST).write_text(json.dumps(manifest))
    kept = {p.name: p.read_bytes() for p in latest.iterdir()}
    data = ["data=text", f"data.paths=[{root / 'corpus'}/*]"]
    (run / "summary.json").unlink()  # killed after its last save: the same command resumes it
    r = run_cli("train", *data, *TINY, "train.steps=6", "train.eval_every=3", "train.ckpt_every=3",
                f"hydra.run.dir={run}", cwd=root)
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert f"train.resume: {latest} is damaged ({why}" in out
    assert f"resuming from {run / 'checkpoints' / 'step_000003'}, 3 steps before the newest checkpoint" in out
    (aside,) = [p for p in (run / "checkpoints").iterdir() if p.name.startswith("step_000006.damaged-")]
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == kept
    assert (run / "checkpoints" / "step_000006" / MANIFEST).is_file()  # trained again, beside it
    assert json.loads((run / "summary.json").read_text())["steps"] == 6


@pytest.mark.parametrize("content", [b'{"steps": 6, "val_lo', b'[1, 2]', b"\xff\xfe"])
def test_a_finished_run_with_a_damaged_summary_sets_it_aside_and_writes_it_again(trained, tmp_path, content):
    root, _ = trained
    run = tmp_path / "run"
    shutil.copytree(root / "outputs" / "run", run)
    (run / "summary.json").write_bytes(content)
    r = run_cli("train", "data=text", f"data.paths=[{root / 'corpus'}/*]", *TINY, "train.steps=6", "train.eval_every=3",
                "train.ckpt_every=3", f"hydra.run.dir={run}", cwd=root)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    (aside,) = run.glob("summary.json.damaged-*")
    assert aside.read_bytes() == content
    assert f"{run / 'summary.json'} is unreadable: set aside as {aside.name}" in " ".join(r.stdout.split())
    assert json.loads((run / "summary.json").read_text())["steps"] == 6


@pytest.mark.parametrize("name", ["metrics.jsonl", ".hydra/overrides.yaml"])
def test_a_directory_where_a_run_file_belongs_is_one_line(trained, tmp_path, name):
    root, _ = trained
    run = tmp_path / "run"
    shutil.copytree(root / "outputs" / "run", run)
    (run / "summary.json").unlink()
    (run / name).unlink()
    (run / name).mkdir()
    r = run_cli("train", "data=text", f"data.paths=[{root / 'corpus'}/*]", *TINY, "train.steps=6", "train.eval_every=3",
                "train.ckpt_every=3", f"hydra.run.dir={run}", cwd=root)
    one_line_error(r, 1, f"({run / name}): a directory stands where a file belongs")


def test_a_resume_from_a_state_with_a_string_for_a_loss_is_one_line(trained, tmp_path):
    """state.json edited, its manifest made to agree: the last evaluation's loss a string. The
    resume names the file and the field; it does not fail at the end comparing it."""
    from llmlab.train.recovery import MANIFEST

    root, _ = trained
    run = tmp_path / "run"
    shutil.copytree(root / "outputs" / "run", run)
    (run / "summary.json").unlink()
    latest = run / "checkpoints" / "step_000006"
    state = json.loads((latest / "state.json").read_text())
    state["val"] = {**state.get("val", {}), "val/loss": "${oc.env:HOME}"}
    (latest / "state.json").write_text(json.dumps(state))
    manifest = json.loads((latest / MANIFEST).read_text())
    manifest["files"]["state.json"] = (latest / "state.json").stat().st_size
    (latest / MANIFEST).write_text(json.dumps(manifest))
    r = run_cli("train", "data=text", f"data.paths=[{root / 'corpus'}/*]", *TINY, "train.steps=6", "train.eval_every=3",
                "train.ckpt_every=3", f"hydra.run.dir={run}", cwd=root)
    one_line_error(r, 1, str(latest), "state.json", "val.val/loss is '${oc.env:HOME}', not a number")


def test_a_summary_reads_only_numbers_from_an_edited_history():
    from llmlab.train.card import summarize

    history = [{"step": 1, "train/loss": 3.0, "val/loss": "low"}, {"step": 2, "train/loss": [1], "val/loss": 2.0},
               {"step": 3, "perf/tokens_per_s": "fast"}]
    out = summarize(history, [], [])
    assert out["train_loss"] == 3.0 and out["val_losses"] == [2.0]


def test_a_resume_reads_an_edited_metrics_history_without_failing(trained, tmp_path):
    """metrics.jsonl records whose keys were changed by a flipped bit (no "step", a string for
    a speed): a resumed run keeps them as they are and times only the numbers."""
    root, _ = trained
    run = tmp_path / "run"
    shutil.copytree(root / "outputs" / "run", run)
    (run / "summary.json").unlink()
    shutil.rmtree(run / "checkpoints" / "step_000006")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"step"', '"stEp"', 1)
    lines[2] = json.dumps({**json.loads(lines[2]), "perf/tokens_per_s": "fast"})
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    r = run_cli("train", "data=text", f"data.paths=[{root / 'corpus'}/*]", *TINY, "train.steps=6", "train.eval_every=3",
                "train.ckpt_every=3", f"hydra.run.dir={run}", cwd=root)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert json.loads((run / "summary.json").read_text())["steps"] == 6
