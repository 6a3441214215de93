"""A seeded mutator of llmlab's inputs, and the oracle that judges what a command did with them.

Each case starts from a copy of one tiny finished run (two checkpoints, a run directory, a
cache entry), changes one thing in it the way a hand, a crash, a full disk or an attacker
would, then runs one command on it in this process, with an alarm against hangs. The
families:

- ``checkpoint``: one file of the newest or an older checkpoint mutated (JSON values of the
  wrong type, keys gone, bytes truncated or flipped, a directory where a file belongs, a
  pickle that would run code in trainer.pt, a ``!!python`` tag in config.yaml, ``_target_``
  and interpolations in the JSON); then ``sample``, ``eval``, ``export`` or a resuming ``train``.
- ``checkpoint+manifest``: the same, with the manifest rewritten to agree with the edit, as a
  crafted checkpoint would.
- ``run``: the run directory's records (metrics.jsonl, summary.json, .hydra's YAML); then
  ``report`` or a resuming ``train``.
- ``cache``: the cache entry (meta.json's fields, a shard's bytes, the tokenizer); then
  ``tokenize`` or ``train``.
- ``overrides``: a random setting of a command set to a random value (numbers out of range,
  NaN, huge integers, lists, a comma without ``-m``, shell and Python payloads).
- ``task``: a multiple-choice task file (JSON lines, or parquet read through `datasets`).
- ``transformers``: the run's transformers export (``llmlab export``) edited as a hand or a
  crafted download would leave it (config.json's fields, the weights' bytes or a tensor's
  shape, the tokenizer files, a shard index naming files outside, a pickle beside or instead
  of the safetensors); then ``eval``, ``sample``, ``export`` or ``train init=`` on it.
- ``links``: one file or folder that a command writes (in a resumed run, an eval, sample,
  tokenize or report folder, an export target) replaced by a symbolic or hard link to a
  victim outside the case, as a planted link in a shared output folder would be.

The oracle counts as defects: a traceback, a refusal longer than one line, the canary file a
payload would create, any change outside the case's folder, an older checkpoint changed or
lost, a victim written through a link, a signal, a hang, and a silent fallback (a command on a run directory that used an
older checkpoint without naming the newest one).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

CANARY = "FUZZ_CANARY"
HANG_S = 120
FAMILIES = ("checkpoint", "checkpoint+manifest", "run", "cache", "overrides", "links", "task", "transformers")
DEFECTS = ("traceback", "multi-line", "canary", "outside", "victim", "older-ckpt", "signal", "hang", "silent-fallback")
VICTIM = b"outside the case: a planted link leads here\n"

TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=32", "tokenizer=byte",
        "logger=none", "train.batch_size=2", "train.log_every=1", "train.eval_windows=2", "train.sample_tokens=4",
        "train.prompts=[x]", "train.eval_every=3", "train.ckpt_every=3", "train.ema=0.5"]
STEPS = 6
# a task file's lines in each layout `llmlab.eval.tasks` reads
TASK_LINES = [{"ctx": "def f(x):\n    return", "endings": [" x", " y", " z"], "label": 0},
              {"question": "import", "choices": {"text": [" os", " sys"], "label": ["A", "B"]}, "answerKey": "A"},
              {"goal": "for i in", "sol1": " range(3):", "sol2": " nothing", "label": 0}]
TEXT = ("def parse(line):\n    return [int(x) for x in line.split(',')]\n\n"
        "class Table:\n    def __init__(self, rows):\n        self.rows = rows\n") * 40

# values a hand or a script might put anywhere: wrong types, extremes, payloads
PAYLOADS = [f"$(touch {CANARY})", f"`touch {CANARY}`", f"__import__('os').system('touch {CANARY}')",
            "${oc.env:HOME}", f"; touch {CANARY}", "../../../etc/passwd", "\x00", "${oc.decode:'[1,2]'}"]
JSON_VALUES = [None, True, -1, 0, 1, 2**70, 1e308, -1e308, 0.5, "", "x", "NaN", [], {}, [1, 2], {"a": 1},
               {"_target_": "os.system", "command": f"touch {CANARY}"}, *PAYLOADS]
OVERRIDE_VALUES = ["-1", "0", "1", "2", "3", "0.5", "-0.5", "1e-40", "1e40", "nan", "inf", "-inf", "null", "true",
                   "99999999999999999999", "[]", "[1,2]", "{a: 1}", "1,2", "x", "''", "abc,def",
                   f"'$(touch {CANARY})'", f"'`touch {CANARY}`'", f"\"__import__('os').system('touch {CANARY}')\"",
                   "${oc.env:HOME}", "auto", "bf16", "none"]
OVERRIDE_KEYS = {
    "train": ["train.steps", "train.batch_size", "train.grad_clip", "train.eval_every", "train.ckpt_every",
              "train.keep_checkpoints", "train.grad_accum", "train.max_flops", "train.resume", "train.compile",
              "train.head_loss", "optim.lr", "optim.weight_decay", "optim.beta2", "sched", "sched.warmup",
              "model.d_model", "model.n_heads", "model.n_layers", "model.max_seq_len", "model/attention",
              "attention.kv_heads", "norm", "pos", "model/ffn", "objective", "tokenizer", "precision", "device",
              "seed", "data.val_fraction", "model.init_std", "model.mtp_heads", "train.prompts", "nonsense.key",
              # a kind's own settings, with the kind chosen first
              "optim=muon optim.momentum", "optim=muon optim.lr", "optim=lion optim.lr", "optim=sgd optim.lr",
              "optim=adafactor optim.beta2_decay", "norm=layerscale norm.init", "model.mtp_heads=1 model.mtp_weight",
              "model/attention=mla attention.kv_rank", "model/attention=swa attention.window",
              "model/attention=dsa attention.topk", "model/ffn=moe ffn.top_k", "sched=wsd sched.decay_fraction",
              "sched.warmup_share", "model.parametrization", "train.max_time", "train.batch_tokens", "train.fsdp",
              "train.context_parallel", "train.ema", "train.z_loss", "model.logit_softcap",
              "train.activation_checkpointing"],
    "sample": ["max_new_tokens", "weights", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "num_samples",
               "seed", "device", "precision", "pack_weights", "prompt", "draft", "spec.k", "spec.mtp",
               "spec.draft_vocab", "stop_at_eos", "nonsense"],
    "eval": ["max_batches", "max_tokens", "batch_size", "split", "device", "precision", "analysis", "weights", "nonsense"],
    "export": ["format", "out", "overwrite", "weights", "nonsense"],
    "report": ["out", "nonsense"],
    "tokenize": ["tokenizer", "tokenizer.vocab_size", "data.val_fraction", "data.workers", "data.shard_tokens",
                 "cache_dir", "nonsense"],
}


@dataclass
class Case:
    index: int
    family: str
    what: str  # the mutation, in words
    command: list[str] = field(default_factory=list)
    on_run_dir: bool = False  # the command names the run directory: it may fall back, aloud
    victims: list[Path] = field(default_factory=list)  # files and folders outside the case a link leads to


@dataclass
class Verdict:
    case: Case
    code: int | None
    outcome: str  # ok | refused | a defect
    detail: str = ""


# -- the base run ---------------------------------------------------------------------------
def build_base(root: Path, run_cli: Callable) -> Path:
    """``root/base``: a cache entry and one tiny finished run with two checkpoints, made from the
    corpus in ``root/corpus``. Every case names that corpus by the same absolute path, so its
    copy of the run and of the entry is the one its command finds (run id, cache key)."""
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    (corpus / "a.py").write_text(TEXT)
    (corpus / "b.py").write_text(TEXT.upper())
    base = root / "base"
    base.mkdir()
    r = run_cli("train", *data_args(root), *TINY, f"train.steps={STEPS}", "hydra.run.dir=run", cwd=base)
    assert r.returncode == 0, r.stderr
    r = run_cli("export", "ckpt=run", "out=transformers", cwd=base)
    assert r.returncode == 0, r.stderr
    return base


def data_args(work: Path) -> list[str]:
    return ["data=text", f"data.paths=[{work / 'corpus'}/*]"]


def tree_digest(root: Path) -> dict[str, str]:
    """Path -> digest of every file under ``root`` (a directory's name alone)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root) + "/"] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            try:
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, root)] = hashlib.blake2b(fh.read(), digest_size=16).hexdigest()
            except OSError as e:
                out[os.path.relpath(p, root)] = f"unreadable {type(e).__name__}"
    return out


def shared_digest(work: Path) -> dict[str, str]:
    """What every case may read but none may change: the base run and the corpus."""
    return {f"{part}/{k}": v for part in ("base", "corpus") for k, v in tree_digest(work / part).items()}


# -- mutations --------------------------------------------------------------------------------
def json_paths(node, prefix=()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += json_paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node[:4]):
            out += json_paths(v, prefix + (i,))
    return out


def mutate_json_value(rng: random.Random, path: Path) -> str:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return mutate_bytes(rng, path)
    paths = [p for p in json_paths(data) if p]
    if not paths:
        path.write_text(json.dumps(rng.choice(JSON_VALUES)))
        return f"{path.name}: replaced whole"
    where = rng.choice(paths)
    parent = data
    for key in where[:-1]:
        parent = parent[key]
    action = rng.random()
    if action < 0.2 and isinstance(parent, dict):
        del parent[where[-1]]
        what = f"{path.name}: deleted {'.'.join(map(str, where))}"
    elif action < 0.28 and isinstance(parent, dict):
        parent["_target_"] = "os.system"
        parent["command"] = f"touch {CANARY}"
        what = f"{path.name}: _target_ beside {'.'.join(map(str, where))}"
    else:
        value = rng.choice(JSON_VALUES)
        parent[where[-1]] = value
        what = f"{path.name}: {'.'.join(map(str, where))} = {str(value)[:30]!r}"
    path.write_text(json.dumps(data, allow_nan=True))
    return what


def mutate_bytes(rng: random.Random, path: Path) -> str:
    raw = path.read_bytes() if path.is_file() else b""
    action = rng.randrange(6)
    if action == 0 and raw:
        cut = rng.randrange(len(raw))
        path.write_bytes(raw[:cut])
        return f"{path.name}: truncated to {cut} bytes"
    if action == 1 and raw:
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(b))
        return f"{path.name}: bits flipped"
    if action == 2:
        path.write_bytes(b"")
        return f"{path.name}: emptied"
    if action == 3:
        path.write_bytes(raw[: len(raw) // 2] + b"\xff\xfe\x80 not utf-8 \xc3\x28" + raw[len(raw) // 2:])
        return f"{path.name}: bytes that are not UTF-8 inserted"
    if action == 4:
        path.unlink(missing_ok=True)
        path.mkdir()
        return f"{path.name}: a directory in its place"
    path.unlink(missing_ok=True)
    return f"{path.name}: deleted"


def mutate_trainer_state(rng: random.Random, path: Path) -> str:
    """A well-formed trainer.pt holding other values: one entry of its nested state (optimizer
    moments and groups, random states) deleted or replaced, as a hand that loaded, edited and
    saved it again would leave it."""
    import torch

    try:
        data = torch.load(path, weights_only=True)
    except Exception:
        return mutate_bytes(rng, path)
    paths = [p for p in json_paths(data) if p]
    if not paths:
        return mutate_bytes(rng, path)
    where = rng.choice(paths)
    parent = data
    for key in where[:-1]:
        parent = parent[key]
    label = ".".join(map(str, where))
    if rng.random() < 0.25 and isinstance(parent, dict):
        del parent[where[-1]]
        what = f"trainer.pt: deleted {label}"
    else:
        value = rng.choice([None, -1, 0, 2**70, float("nan"), "x", [], {}, torch.zeros(1), torch.zeros(3, 2),
                            torch.zeros(2, dtype=torch.float64), torch.tensor(float("inf"))])
        parent[where[-1]] = value
        what = f"trainer.pt: {label} = {str(value)[:30]!r}"
    torch.save(data, path)
    return what


class Payload:
    """Pickles to a call of os.system: loading it with pickle would create the canary."""

    def __reduce__(self):
        return (os.system, (f"touch {CANARY}",))


def edit_tensor_shape(rng: random.Random, path: Path) -> str:
    """A safetensors file whose header gives one tensor another shape (the data left as is)."""
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    key = rng.choice([k for k in header if k != "__metadata__"])
    header[key]["shape"] = rng.choice([[1], [10**9], [], [3, -1]])
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n:])
    return f"{path.name}: the shape of {key} edited"


def mutate_checkpoint_file(rng: random.Random, ckpt: Path) -> str:
    import torch

    files = sorted(p.name for p in ckpt.iterdir() if p.is_file() and p.name != "manifest.json")
    name = rng.choice(files + ["manifest.json"])
    path = ckpt / name
    if name == "trainer.pt" and rng.random() < 0.35:
        torch.save({"optimizer": Payload()}, path)
        return "trainer.pt: a pickle that runs os.system"
    if name == "trainer.pt" and rng.random() < 0.6:
        return mutate_trainer_state(rng, path)
    if name == "config.yaml" and rng.random() < 0.4:
        path.write_text(path.read_text() + f"\npayload: !!python/object/apply:os.system ['touch {CANARY}']\n")
        return "config.yaml: a !!python tag"
    if name == "model.safetensors" and rng.random() < 0.3:
        return edit_tensor_shape(rng, path)
    if name.endswith(".json") and rng.random() < 0.75:
        return mutate_json_value(rng, path)
    return mutate_bytes(rng, path)


def mutate_transformers_dir(rng: random.Random, hf: Path) -> str:
    """One edit of a transformers directory."""
    import torch

    action = rng.random()
    if action < 0.1:  # the weights only as a pickle that would run code
        (hf / "model.safetensors").unlink()
        torch.save({"model.embed_tokens.weight": Payload()}, hf / "pytorch_model.bin")
        return "model.safetensors replaced by a pytorch_model.bin that runs os.system"
    if action < 0.2:  # shards, one of them named by a crafted index
        weights = hf / "model.safetensors"
        (hf / "model-00001.safetensors").write_bytes(weights.read_bytes())
        weights.unlink()
        from safetensors import safe_open
        with safe_open(str(hf / "model-00001.safetensors"), "pt") as f:
            names = list(f.keys())
        shard = rng.choice(["model-00001.safetensors", "../run/checkpoints/step_000006/model.safetensors",
                            "/etc/passwd", "missing.safetensors", *PAYLOADS, None, 7])
        weight_map = {n: "model-00001.safetensors" for n in names}
        weight_map[rng.choice(names)] = shard
        (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        return f"sharded, the index naming {str(shard)[:40]!r}"
    name = rng.choice(["config.json", "config.json", "config.json", "model.safetensors", "model.safetensors",
                       "tokenizer.json", "tokenizer_config.json", "generation_config.json"])
    path = hf / name
    if name == "model.safetensors" and rng.random() < 0.5:
        return edit_tensor_shape(rng, path)
    if name.endswith(".json") and rng.random() < 0.8:
        return mutate_json_value(rng, path)
    return mutate_bytes(rng, path)


def agree_manifest(ckpt: Path) -> None:
    """Rewrite the manifest to list the files as they now are (a crafted checkpoint)."""
    manifest = ckpt / "manifest.json"
    try:
        data = json.loads(manifest.read_text())
        files = data["files"] if isinstance(data, dict) and isinstance(data.get("files"), dict) else {}
    except (OSError, ValueError):
        data, files = {}, {}
    files = {name: (ckpt / name).stat().st_size for name in files if (ckpt / name).is_file()}
    data = data if isinstance(data, dict) else {}
    data["files"] = files
    if manifest.is_dir():
        shutil.rmtree(manifest)
    manifest.write_text(json.dumps(data))


def make_case(index: int, seed: int, case_dir: Path, base: Path) -> Case:
    """Copy the base into ``case_dir``, mutate it by the case's own random stream, and return
    the command to run there."""
    rng = random.Random(f"{seed}-{index}")
    family = FAMILIES[rng.randrange(len(FAMILIES))]
    shutil.copytree(base, case_dir, symlinks=True)
    run = case_dir / "run"
    ckpts = run / "checkpoints"
    newest, older = ckpts / f"step_{STEPS:06d}", ckpts / "step_000003"
    data = data_args(base.parent)
    resume = ["train", *data, *TINY, f"train.steps={STEPS}", "hydra.run.dir=run"]
    case = Case(index, family, "")
    if family.startswith("checkpoint"):
        target = newest if rng.random() < 0.75 else older
        case.what = f"{target.name}/" + mutate_checkpoint_file(rng, target)
        if family == "checkpoint+manifest":
            agree_manifest(target)
        which = rng.randrange(5)
        named = run if rng.random() < 0.6 else target
        weights = ["weights=ema"] if rng.random() < 0.5 else []  # ema.safetensors read as the model's weights
        case.on_run_dir = named == run
        if which == 0:
            case.command = ["sample", f"ckpt={named}", "max_new_tokens=4", "prompt=x", *weights]
        elif which == 1:
            case.command = ["eval", f"ckpt={named}", "max_batches=2", *weights]
        elif which == 2:
            case.command = ["export", f"ckpt={named}", f"out={case_dir / 'hf'}", *weights]
        else:  # a killed run resumed by the same command
            (run / "summary.json").unlink()
            case.command, case.on_run_dir = resume, True
    elif family == "run":
        target = rng.choice([run / "metrics.jsonl", run / "summary.json", run / ".hydra" / "overrides.yaml",
                             run / ".hydra" / "config.yaml"])
        case.what = (mutate_json_value(rng, target) if target.name == "summary.json" and rng.random() < 0.7
                     else mutate_bytes(rng, target))
        if rng.random() < 0.5:
            case.command = ["report", str(run), f"out={case_dir / 'report'}"]
        else:  # a killed run resumed by the same command (a damaged summary.json is left to say so)
            if target.name != "summary.json" and (run / "summary.json").is_file():
                (run / "summary.json").unlink()
            case.command, case.on_run_dir = resume, True
    elif family == "cache":
        (entry,) = [p for p in (case_dir / ".cache").iterdir() if (p / "meta.json").is_file()]
        target = rng.choice([entry / "meta.json", entry / "meta.json", entry / "train" / "000000.bin",
                             entry / "val" / "000000.bin", entry / "tokenizer.json"])
        if target.suffix == ".bin" and rng.random() < 0.5:
            import numpy as np
            ids = np.fromfile(target, dtype=np.uint16)
            i = rng.randrange(max(1, len(ids)))
            ids[i] = rng.choice([97, 65535, 300, 0])
            ids.tofile(target)
            case.what = f"{target.parent.name}/{target.name}: id {i} set to {int(ids[i])}"
        else:
            case.what = (mutate_json_value(rng, target) if target.suffix == ".json" and rng.random() < 0.7
                         else mutate_bytes(rng, target))
        case.command = (["tokenize", *data, "tokenizer=byte"] if rng.random() < 0.5
                        else ["train", *data, *TINY, "train.steps=2", "hydra.run.dir=other"])
    elif family == "task":  # a multiple-choice task file (llmlab eval tasks=[...]), edited by hand or crafted
        task = case_dir / "task.jsonl"
        lines = [json.dumps(q) for q in TASK_LINES]
        i = rng.randrange(len(lines))
        if rng.random() < 0.2:  # a datasets source (parquet) whose bytes are damaged
            import datasets
            task = case_dir / "task.parquet"
            datasets.Dataset.from_list([TASK_LINES[0]] * 3).to_parquet(str(task))
            case.what = mutate_bytes(rng, task)
        elif rng.random() < 0.7:  # one line's JSON, edited as any JSON file is
            one = case_dir / "line.json"
            one.write_text(lines[i])
            case.what = f"task.jsonl line {i + 1}: " + mutate_json_value(rng, one)
            lines[i] = one.read_text().replace("\n", " ")
            task.write_text("\n".join(lines) + "\n")
        else:
            task.write_text("\n".join(lines) + "\n")
            case.what = mutate_bytes(rng, task)
        case.command = ["eval", f"ckpt={run}", f"tasks=[{task}]", "max_batches=2", f"hydra.run.dir={case_dir / 'ev'}"]
    elif family == "transformers":
        case.what = mutate_transformers_dir(rng, case_dir / "transformers")
        hf = case_dir / "transformers"
        case.command = rng.choice([
            ["eval", f"ckpt={hf}", *data, "max_batches=2", f"hydra.run.dir={case_dir / 'ev'}"],
            ["sample", f"ckpt={hf}", "max_new_tokens=4", "prompt=x"],
            ["export", f"ckpt={hf}", f"out={case_dir / 'again'}"],
            ["train", *data, *[a for a in TINY if not a.startswith("tokenizer=")], f"init={hf}", "train.steps=2",
             "hydra.run.dir=from-hf"]])
    elif family == "links":
        case.command, case.what, case.victims = plant_link(rng, case_dir, run, resume)
        case.on_run_dir = case.command is resume
    else:
        command = rng.choice(list(OVERRIDE_KEYS))
        *kind, key = rng.choice(OVERRIDE_KEYS[command]).split()  # "optim=muon optim.momentum": the kind, then its key
        value = rng.choice(OVERRIDE_VALUES)
        setting = f"{key}={value}"
        case.what = " ".join([*kind, setting])
        base_args = {"train": [*data, *TINY, "train.steps=2", "hydra.run.dir=other"],
                     "sample": [f"ckpt={run}", "max_new_tokens=4", "prompt=x"],
                     "eval": [f"ckpt={run}", "max_batches=2"],
                     "export": [f"ckpt={run}", f"out={case_dir / 'hf'}"],
                     "report": [str(run), f"out={case_dir / 'report'}"],
                     "tokenize": [*data, "tokenizer=byte"]}[command]
        # the fuzzed setting replaces the base's own value of that key
        args = [a for a in base_args if a.split("=")[0] != key]
        case.command = [command, *args, *kind, setting]
    return case


# what each command writes into a folder it may find already there, by the folder it writes into
LINK_TARGETS = {
    "train": ("run", [".hydra/overrides.yaml", ".hydra/config.yaml", ".hydra/hydra.yaml", "config.yaml", "train.log",
                      "metrics.jsonl", "summary.json", "samples.jsonl", ".lock", ".lock.pid", ".hydra/", "checkpoints/",
                      "./"]),
    "eval": ("ev", ["eval.json", "per_position.json", "per_position.png", "eval.log", "./"]),
    "sample": ("sm", ["samples.jsonl", "sample.log", "./"]),
    "tokenize": ("tk", ["tokenize.json", "tokenize.log", "./"]),
    "report": ("rep", ["report.md", "report.json", "report.png", "./"]),
    "export": ("hf", ["./"]),
}


def plant_link(rng: random.Random, case_dir: Path, run: Path, resume: list[str]) -> tuple[list[str], str, list[Path]]:
    """One name a command writes, made a link to a victim outside ``case_dir``: a file (a
    symbolic or a hard link) or an empty folder (a symbolic link). Returns the command, the
    mutation in words and the victims."""
    command = rng.choice(list(LINK_TARGETS))
    folder, names = LINK_TARGETS[command]
    name = rng.choice(names)
    where = case_dir / folder / name if name != "./" else case_dir / folder
    victims = case_dir.parent / f"victims-{case_dir.name}"
    victims.mkdir()
    if command == "train":  # a killed run resumed by the same command
        (run / "summary.json").unlink()
    where.parent.mkdir(parents=True, exist_ok=True)
    if where.is_dir() and not where.is_symlink():
        shutil.rmtree(where)
    else:
        where.unlink(missing_ok=True)
    if name.endswith("/"):
        victim = victims / "folder"
        victim.mkdir()
        where.symlink_to(victim, target_is_directory=True)
        how = "a symbolic link to a folder outside"
    else:
        victim = victims / "file"
        victim.write_bytes(VICTIM)
        hard = rng.random() < 0.25
        (os.link if hard else os.symlink)(victim, where)
        how = f"a {'hard' if hard else 'symbolic'} link to a file outside"
    args = {"train": resume,
            "eval": ["eval", f"ckpt={run}", "max_batches=2", f"hydra.run.dir={case_dir / 'ev'}"],
            "sample": ["sample", f"ckpt={run}", "max_new_tokens=4", "prompt=x", f"hydra.run.dir={case_dir / 'sm'}"],
            "tokenize": ["tokenize", *data_args(case_dir.parent), "tokenizer=byte", f"hydra.run.dir={case_dir / 'tk'}"],
            "report": ["report", str(run), f"out={case_dir / 'rep'}"],
            "export": ["export", f"ckpt={run}", f"out={case_dir / 'hf'}"]}[command]
    return args, f"{folder}/{name.rstrip('/') if name != './' else ''}: {how}".replace("/:", ":"), [victim]


def victims_intact(victims: list[Path]) -> bool:
    """Every victim as planted: a file with its bytes, a folder still empty."""
    for v in victims:
        if v.is_dir() and not v.is_symlink():
            if any(v.iterdir()):
                return False
        elif not v.is_file() or v.read_bytes() != VICTIM:
            return False
    return True


# -- the oracle ---------------------------------------------------------------------------------
class Hang(BaseException):
    """Raised by the alarm: a BaseException, so that the in-process command's own handler
    (which prints what an uncaught Exception would) lets it through as a hang."""


def judge(case: Case, case_dir: Path, base: Path, base_digest: dict, run_cli: Callable) -> Verdict:
    """Run the case's command in ``case_dir`` and classify what happened."""
    ckpts = case_dir / "run" / "checkpoints"
    older = ckpts / "step_000003"
    older_before = tree_digest(older) if older.is_dir() else None

    def alarm(signum, frame):
        raise Hang()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(HANG_S)
    try:
        r = run_cli(*case.command, cwd=case_dir)
    except Hang:
        return Verdict(case, None, "hang", f"no end after {HANG_S} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    text = r.stdout + r.stderr
    if (case_dir / CANARY).exists() or (Path.cwd() / CANARY).exists() or (base / CANARY).exists():
        return Verdict(case, r.returncode, "canary", "a payload ran")
    if shared_digest(base.parent) != base_digest:
        return Verdict(case, r.returncode, "outside", "a file outside the case's folder changed")
    if not victims_intact(case.victims):
        return Verdict(case, r.returncode, "victim", f"written through the link ({case.what})")
    if r.returncode is not None and r.returncode < 0:
        return Verdict(case, r.returncode, "signal")
    if "Traceback" in text:
        return Verdict(case, r.returncode, "traceback", last_lines(text))
    if older_before is not None and "older" not in case.what and not case.what.startswith("step_000003"):
        after = tree_digest(older) if older.is_dir() else None
        if after != older_before:
            return Verdict(case, r.returncode, "older-ckpt", "step_000003 changed or vanished")
    if r.returncode != 0:
        from tests.conftest import the_error_line
        line = the_error_line(r.stderr)
        if line is None:
            return Verdict(case, r.returncode, "multi-line", last_lines(r.stderr))
        return Verdict(case, r.returncode, "refused", line[:200])
    newest = ckpts / f"step_{STEPS:06d}"
    if case.on_run_dir and case.what.startswith(newest.name) and str(older) in text and str(newest) not in text:
        return Verdict(case, 0, "silent-fallback", "used step_000003 without a word about the newest")
    return Verdict(case, 0, "ok")


def last_lines(text: str, n: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-n:])[:400]


def run_cases(seed: int, indices, work: Path, run_cli: Callable, base: Path | None = None,
              progress: Callable[[Verdict], None] | None = None) -> list[Verdict]:
    """Build the base once (unless given), then make, run and judge each case in its own folder."""
    work.mkdir(parents=True, exist_ok=True)
    base = base or build_base(work, run_cli)
    digest = shared_digest(work)
    verdicts = []
    for i in indices:
        case_dir = work / f"case-{i:05d}"
        case = make_case(i, seed, case_dir, base)
        verdicts.append(judge(case, case_dir, base, digest, run_cli))
        if progress:
            progress(verdicts[-1])
        shutil.rmtree(case_dir, ignore_errors=True)
        shutil.rmtree(work / f"victims-{case_dir.name}", ignore_errors=True)
    return verdicts


def table(rows: list[dict]) -> str:
    """Cases by family (``rows``: verdicts as `record` writes them): how many ran, ended well,
    were refused in one line, and each defect."""
    cols = ["cases", "ok", "refused", *DEFECTS]
    lines = []
    for family in (*FAMILIES, "all"):
        rs = [r for r in rows if family in ("all", r["family"])]
        counts = {"cases": len(rs), **{c: sum(r["outcome"] == c for r in rs) for c in cols[1:]}}
        lines.append(f"| {family} | " + " | ".join(str(counts[c]) for c in cols) + " |")
    head = "| family | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 1)
    return head + "\n" + "\n".join(lines)


def record(v: Verdict) -> dict:
    return {"index": v.case.index, "family": v.case.family, "what": v.case.what, "command": v.case.command,
            "code": v.code, "outcome": v.outcome, "detail": v.detail}


def family_of(seed: int, index: int) -> str:
    """The family of case ``index`` of ``seed`` (the first draw of its stream), without making it."""
    return FAMILIES[random.Random(f"{seed}-{index}").randrange(len(FAMILIES))]


def _worker(args) -> int:
    """One of ``--jobs`` processes: its share of the cases on the shared base, one JSON line each."""
    from tests.conftest import run_cli

    work = Path(args.work)
    indices = range(args.part, args.cases, args.jobs)
    counts = {"done": 0, "defects": 0}
    with open(work / f"part-{args.part}.jsonl", "w") as out:
        def progress(v: Verdict) -> None:
            out.write(json.dumps(record(v)) + "\n")
            out.flush()
            counts["done"] += 1
            counts["defects"] += v.outcome not in ("ok", "refused")
            if counts["done"] % 100 == 0:  # a long run says how far it is
                print(f"fuzz: process {args.part}: {counts['done']} of {len(indices)} cases, "
                      f"{counts['defects']} defects so far", flush=True)
        run_cases(args.seed, indices, work, run_cli, base=work / "base", progress=progress)
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse
    import subprocess
    import tempfile
    import time

    ap = argparse.ArgumentParser(description="llmlab's input fuzzer: N mutated cases, a table of outcomes")
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes that share the cases")
    ap.add_argument("--out", default=None, help="also write every verdict here, one JSON line each")
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--part", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.part is not None:
        return _worker(args)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    repo = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(repo))
    from tests.conftest import run_cli

    print(f"fuzz: seed {seed}, {args.cases} cases in {args.jobs} processes", flush=True)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="llmlab-fuzz-") as tmp:
        work = Path(tmp)
        build_base(work, run_cli)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
        procs = [subprocess.Popen([sys.executable, "-m", "tests.fuzz.cases", f"--seed={seed}", f"--cases={args.cases}",
                                   f"--jobs={args.jobs}", f"--work={work}", f"--part={k}"], env=env, cwd=repo)
                 for k in range(args.jobs)]
        codes = [p.wait() for p in procs]
        rows = []
        for k in range(args.jobs):
            part = work / f"part-{k}.jsonl"
            rows += [json.loads(line) for line in part.read_text().splitlines()] if part.is_file() else []
        done = {r["index"] for r in rows}
        for i in sorted(set(range(args.cases)) - done):  # a process that died took its case with it
            k = i % args.jobs
            rows.append({"index": i, "family": family_of(seed, i), "what": "?", "command": [], "code": codes[k],
                         "outcome": "signal" if codes[k] < 0 else "hang", "detail": f"worker {k} exited {codes[k]}"})
    rows.sort(key=lambda r: r["index"])
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    defects = [r for r in rows if r["outcome"] not in ("ok", "refused")]
    for r in defects:
        print(f"DEFECT case {r['index']} ({r['family']}: {r['what']}; llmlab {' '.join(r['command'])}) -> "
              f"{r['outcome']}: {r['detail']}")
    print(table(rows))
    print(f"seed {seed}: {len(rows)} cases in {time.time() - t0:.0f} s, {len(defects)} defects")
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
