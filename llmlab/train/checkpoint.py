"""Checkpoints: one directory per save, written under a temporary name and renamed.

The writer and the reader live here; what makes a checkpoint complete (its required files
and manifest) and the recovery after a kill live in `llmlab.train.recovery`, which both use,
so the format has a single definition.

    step_000500/
      model.safetensors   weights (tied tensors stored once)
      trainer.pt          optimizer and RNG states (tensors and plain data: weights_only)
      state.json          step, tokens seen, data-sampler state
      model.json          the ModelSpec that rebuilds the network
      config.yaml         the resolved config of the run
      tokenizer.json      the tokenizer, so sample/eval need nothing else
      token_counts.safetensors  how often each token id occurs in the training data (a
                          speculative draft's shortlist, ``spec.draft_vocab``); optional

Loading reads and checks everything before touching the model, and never unpickles code.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
import yaml
from omegaconf import OmegaConf
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from llmlab.errors import UserError
from llmlab.perf import is_number
from llmlab.files import checkpoint_arg, clean_stale, disk_error, own_dir, owned_tmp_dir, replace_dir
from llmlab.train.ema import EMA_FILE
from llmlab.train.recovery import MANIFEST, completeness, fsync_dir

TOKEN_COUNTS = "token_counts.safetensors"
STEP_DIR = re.compile(r"^step_(\d+)$")


def unique_names(model: torch.nn.Module) -> list[str]:
    """State-dict names with each shared (tied) tensor once, under its first name."""
    names, seen = [], set()
    for name, t in model.state_dict().items():
        key = (t.data_ptr(), t.shape, t.dtype) if t.numel() else (name,)
        if key not in seen:
            seen.add(key)
            names.append(name)
    return names


def unique_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with each shared tensor once (safetensors refuses aliases)."""
    state = model.state_dict()
    return {name: state[name].detach().cpu().contiguous() for name in unique_names(model)}


def save_checkpoint(ckpt_root: Path, step: int, model: torch.nn.Module | Mapping[str, torch.Tensor], spec_dict: dict,
                    config: Any, tokenizer_path: Path, state: dict, trainer_state: dict | None = None,
                    keep: int | None = None, token_counts: np.ndarray | torch.Tensor | None = None,
                    ema: Mapping[str, torch.Tensor] | None = None) -> Path:
    """Write one checkpoint directory atomically. ``model`` is a module, or its weights
    already gathered (each tied tensor once). ``token_counts``: (vocab,) occurrences of each
    token id in the training data, kept beside the weights. ``ema``: the weights' moving
    average (`llmlab.train.ema`), saved as ema.safetensors.

    The files go to a temporary directory; ``manifest.json`` (every file and its size) is
    written last, and the directory is renamed into place. A re-save of a step that exists
    moves the old copy aside before the rename and deletes it after, so at every instant a
    complete copy exists under a name `recover_checkpoints` knows. The caller is the run
    directory's one writer (`llmlab.files.RunLock`)."""
    ckpt_root = Path(ckpt_root)
    own_dir(ckpt_root)
    clean_stale(ckpt_root)  # left by a writer that died
    name = f"step_{step:06d}"
    final = ckpt_root / name
    tmp = None
    try:
        tmp = owned_tmp_dir(ckpt_root, name)
        weights = (unique_state_dict(model) if isinstance(model, torch.nn.Module)
                   else {k: v.detach().cpu().contiguous() for k, v in model.items()})
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if ema is not None:
            save_file(dict(ema), str(tmp / EMA_FILE), metadata={"format": "pt"})
        if trainer_state is not None:
            torch.save(trainer_state, tmp / "trainer.pt")
        (tmp / "model.json").write_text(json.dumps(spec_dict, indent=2))
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
        conf = config if isinstance(config, dict) else OmegaConf.to_container(config, resolve=True)
        (tmp / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(conf)))
        shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
        if token_counts is not None:
            save_file({"counts": torch.as_tensor(token_counts, dtype=torch.int64).contiguous()}, str(tmp / TOKEN_COUNTS))
        files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir())}
        (tmp / MANIFEST).write_text(json.dumps({"format": 1, "step": step, "files": files}, indent=2))
        replace_dir(tmp, final)  # durable first; a re-save's old copy stays until the new one is in
        fsync_dir(ckpt_root)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, Exception):
            last = list_checkpoints(ckpt_root)
            problem = disk_error(e, f"checkpoint {final}",
                                 f"the last complete checkpoint is {last[-1] if last else 'none'}")
            if problem is not None:
                raise problem from e
        raise
    if keep:
        found = list_checkpoints(ckpt_root)
        best, unranked = rank_checkpoints(ckpt_root)
        for old in found[:-keep]:
            if old == best:  # the last `keep` and the best by validation loss stay
                continue
            if old in unranked:  # it might be the best: kept, and said once
                if old not in _SAID_KEPT:
                    from llmlab import console
                    console.err.print(f"ckpt: keeping {old} past train.keep_checkpoints={keep}: {unranked[old]}, so it cannot "
                                      "be ranked against the best; delete it by hand if it is not wanted",
                                      style="yellow")
                    _SAID_KEPT.add(old)
                continue
            shutil.rmtree(old, ignore_errors=True)
    return final


def best_checkpoint(ckpt_root: Path) -> Path | None:
    """The checkpoint whose state records the lowest validation loss, if any recorded one."""
    return rank_checkpoints(ckpt_root)[0]


def rank_checkpoints(ckpt_root: Path) -> tuple[Path | None, dict[Path, str]]:
    """The checkpoint with the lowest recorded validation loss (None if none recorded a
    finite one), and the checkpoints that cannot be ranked because their ``state.json`` is
    not what a save writes (unreadable, not JSON, not mappings, a loss that is not a number),
    each with what is wrong. A checkpoint saved before any evaluation, or whose loss is NaN
    or infinite (a diverged run), has no score and is not among the unranked."""
    scored, unranked = [], {}
    for path in list_checkpoints(ckpt_root):
        try:
            state = json.loads((path / "state.json").read_text())
        except OSError as e:
            unranked[path] = f"its state.json cannot be read ({e.strerror or e})"
            continue
        except ValueError:
            unranked[path] = "its state.json is not JSON"
            continue
        val = state.get("val") if isinstance(state, dict) else None
        loss = val.get("val/loss") if isinstance(val, dict) else None
        if not isinstance(state, dict) or not isinstance(val, (dict, type(None))):
            unranked[path] = "its state.json does not hold the records a save writes"
        elif loss is not None and not is_number(loss):
            unranked[path] = f"its state.json gives the validation loss as {loss!r}, not a number"
        elif loss is not None and math.isfinite(loss):
            scored.append((loss, path))
    return (min(scored)[1] if scored else None), unranked


_SAID_KEPT: set[Path] = set()  # unranked checkpoints already named by this process


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoint directories under ``ckpt_root``, oldest first."""
    if not Path(ckpt_root).is_dir():
        return []
    found = [(int(m.group(1)), p) for p in Path(ckpt_root).iterdir()
             if p.is_dir() and (m := STEP_DIR.match(p.name)) and completeness(p) is None]
    return [p for _, p in sorted(found)]


def check_described(p: Path, key: str) -> None:
    """Weights with nothing that says what network they belong to are one line naming ``key``."""
    if not any((p / f).exists() for f in (MANIFEST, "model.json", "config.json")) and (p / "model.safetensors").exists():
        raise UserError(f"{key}: {p} has weights but neither model.json (an llmlab checkpoint) nor config.json (a "
                        "transformers directory) to say what network they belong to")


def _existing(path) -> Path:
    p = checkpoint_arg(path)
    return latest_run_checkpoint(Path("outputs")) if p is None else p


def is_checkpoint_dir(p: Path) -> bool:
    return any((p / f).exists() for f in (MANIFEST, "model.safetensors", "model.json"))


def step_dirs(ckpt_root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every ``step_N`` directory under ``ckpt_root``, complete or not, newest first."""
    if not Path(ckpt_root).is_dir():
        return []
    found = [(int(m.group(1)), q) for q in Path(ckpt_root).iterdir() if (m := STEP_DIR.match(q.name)) and q.is_dir()]
    return sorted(found, reverse=True)


def load_latest(ckpt_root: Path, trainer: bool = False) -> tuple[Checkpoint | None, list[tuple[int, Path, str]]]:
    """The newest checkpoint under ``ckpt_root`` that loads, and (step, path, why) of each newer
    one passed over, newest first. One rule for every file: a checkpoint whose manifest does not
    match its files, or whose weights, metadata or (``trainer``: a resume's) trainer.pt do not
    load, is passed over, and the caller says so."""
    passed: list[tuple[int, Path, str]] = []
    for step, q in step_dirs(ckpt_root):
        why = completeness(q)
        if why is None:
            try:
                ckpt = _load_dir(q)
                if trainer:
                    ckpt.trainer_state()  # kept for the resume that asked
                return ckpt, passed
            except UserError as e:
                why = str(e).removeprefix("ckpt: ").replace(f"{q}/", "").replace(f"{q} ", "it ")
        passed.append((step, q, why))
    return None, passed


def latest_run_checkpoint(outputs: Path) -> Path:
    """``ckpt=latest``: the newest checkpoint of any run under ``outputs/`` (sweeps included)."""
    found = [c for c in Path(outputs).glob("**/checkpoints/step_*") if completeness(c) is None]
    if not found:
        raise UserError(f"ckpt=latest: no checkpoints under {Path(outputs).resolve()}; train first (llmlab train)")
    return max(found, key=lambda c: (c / "model.safetensors").stat().st_mtime).resolve()


@dataclass
class Checkpoint:
    path: Path
    spec: dict
    state: dict
    config: dict
    weights: dict[str, torch.Tensor]
    spec_file: str = "model.json"  # what describes the network: config.json for a transformers directory

    @property
    def tokenizer_path(self) -> Path:
        return self.path / "tokenizer.json"

    @property
    def objective(self) -> str:
        return str((self.spec.get("objective") or {}).get("kind", "clm"))  # checkpoints before objectives: clm

    @property
    def causal(self) -> bool:
        """Whether the model predicts left to right (its objective says so), so it can sample."""
        from llmlab.model.objective import OBJECTIVE
        return OBJECTIVE.get(self.objective, "objective").causal

    def tokenizer(self):
        from llmlab.data.tokenizer import EOS, TextTokenizer
        return TextTokenizer.load(self.tokenizer_path, self.state.get("eos", EOS))

    def token_counts(self) -> torch.Tensor | None:
        """(vocab,) int64: how often each token id occurs in the training data; None for a
        checkpoint saved without them."""
        f = self.path / TOKEN_COUNTS
        if not f.exists():
            return None
        try:
            return load_file(str(f))["counts"]
        except (SafetensorError, OSError, ValueError, KeyError) as e:
            raise UserError(f"ckpt: {f} is unreadable ({type(e).__name__}); the checkpoint is damaged") from e

    def ema_weights(self) -> dict[str, torch.Tensor] | None:
        """ema.safetensors: the weights' moving average (`llmlab.train.ema`); None for a
        checkpoint saved without train.ema."""
        f = self.path / EMA_FILE
        if not f.exists():
            return None
        try:
            return load_file(str(f))
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(f"ckpt: {f} is truncated or corrupt ({str(e).splitlines()[0]})") from e

    def trainer_state(self) -> dict | None:
        """trainer.pt's contents (loaded once and kept until `drop_trainer_state`), or None."""
        if "_trainer" not in self.__dict__:
            f = self.path / "trainer.pt"
            if not f.exists():
                self.__dict__["_trainer"] = None
            else:
                try:
                    self.__dict__["_trainer"] = torch.load(f, map_location="cpu", weights_only=True)
                except Exception as e:
                    raise UserError(f"ckpt: {f} is unreadable ({type(e).__name__}); the checkpoint is damaged") from e
        return self.__dict__["_trainer"]

    def drop_trainer_state(self) -> None:
        """Free the optimizer state once it is in the optimizer."""
        self.__dict__.pop("_trainer", None)


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """A checkpoint directory, loaded; or a run directory's newest checkpoint that loads, each
    newer one passed over named on stderr with what is wrong with it (`load_latest`)."""
    p = _existing(path)
    from llmlab.export.hf_load import is_hf_dir, load_hf_dir
    if is_hf_dir(p):
        spec, weights, eos = load_hf_dir(p)
        return Checkpoint(p, spec, {"step": None, "eos": eos}, {}, weights, spec_file="config.json")
    check_described(p, "ckpt")
    if is_checkpoint_dir(p):
        return _load_dir(p)
    for root in (p / "checkpoints", p):
        ckpt, passed = load_latest(root)
        if ckpt is not None:
            from llmlab import console
            for _, q, why in passed:
                console.err.print(f"ckpt: passing over {q} ({why}); using {ckpt.path}", style="yellow")
            return ckpt
        if passed:
            _, q, why = passed[0]
            raise UserError(f"ckpt: {p} has no usable checkpoint: the latest, {q}, is damaged ({why})")
    raise UserError(f"ckpt: {p} is neither a checkpoint (no model.safetensors), a transformers directory (no "
                    "config.json) nor a run directory with checkpoints/")


def _load_dir(p: Path) -> Checkpoint:
    problem = completeness(p)
    if problem is not None:
        raise UserError(f"ckpt: {p} is not a complete checkpoint ({problem})")
    try:
        weights = load_file(str(p / "model.safetensors"))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"ckpt: {p / 'model.safetensors'} is truncated or corrupt ({str(e).splitlines()[0]})") from e
    try:
        spec = check_model_json(json_object(p / "model.json"), p / "model.json")
        state = json_object(p / "state.json")
        check_step(state, p)
        # plain YAML: an interpolation or tag in a downloaded config stays literal text
        config = yaml.safe_load((p / "config.yaml").read_text()) or {}
        if not isinstance(config, dict):
            raise ValueError(f"{p / 'config.yaml'} holds a {type(config).__name__}, not a mapping")
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"ckpt: {p} has an unreadable metadata file ({type(e).__name__}: "
                        f"{(str(e).splitlines() or [''])[0]})") from e
    return Checkpoint(p, spec, state, config, weights)


# model.json's sections, each a mapping (a checkpoint from before objectives has none)
SPEC_SECTIONS = ("model", "attention", "ffn", "norm", "pos", "objective")


def check_model_json(spec: dict, path: Path) -> dict:
    """The types of model.json's fields, before anything builds from them: an edited one (a
    list where a section's mapping belongs, a vocabulary that is not a count) is one line
    naming the field, not a TypeError inside the build."""
    def bad(field: str, expected: str) -> UserError:
        return UserError(f"ckpt: {path}: {field} must be {expected}; the checkpoint is damaged or was edited")

    vocab = spec.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        raise bad("vocab_size", "a positive integer")
    for section in SPEC_SECTIONS:
        if section in spec and not isinstance(spec[section], dict) and not (section == "objective" and spec[section] is None):
            raise bad(section, "a mapping of settings")
    return spec


def check_step(state: dict, path: Path) -> None:
    """A checkpoint directory named for one step whose state.json records another was renamed
    or edited: which one to believe is the user's call, not a guess."""
    m = STEP_DIR.match(path.name)
    step = state.get("step")  # a step that is not a count is the resume's to refuse, naming the part
    if m and isinstance(step, int) and not isinstance(step, bool) and step != int(m.group(1)):
        raise UserError(f"ckpt: {path} is named for step {int(m.group(1))} but its state.json records step {step!r}; "
                        "the checkpoint was renamed or edited: rename the directory to the step it holds, or "
                        "choose another checkpoint")


def json_object(path: Path) -> dict:
    value = json.loads(path.read_text())
    if not isinstance(value, dict):
        raise UserError(f"ckpt: {path} holds a JSON {type(value).__name__}, not an object; the checkpoint is damaged")
    return value


def load_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], where: Path,
                 built_from: str = "its model.json") -> None:
    """Copy ``weights`` into ``model`` only after every name and shape has been checked.
    ``built_from``: what the model was built from, for the message when they disagree."""
    expected = model.state_dict()
    # a tied tensor is stored once, under one of its names
    stored = {expected[k].data_ptr() for k in weights if k in expected}
    missing = [k for k in expected if k not in weights and expected[k].data_ptr() not in stored]
    unexpected = [k for k in weights if k not in expected]
    wrong = [k for k in weights if k in expected and tuple(weights[k].shape) != tuple(expected[k].shape)]
    if missing or unexpected or wrong:
        detail = (f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}" if unexpected
                  else f"shape mismatch {wrong[:3]}")
        raise UserError(f"ckpt: {where} does not match {built_from} ({detail})")
    model.load_state_dict(weights, strict=False)


def build_model(ckpt: Checkpoint, device: torch.device, weights: str = "raw"):
    """The network a checkpoint describes, with its weights (``weights=ema``: their moving
    average, ema.safetensors), on ``device``, in eval mode."""
    from llmlab.errors import ConfigError
    from llmlab.model.transformer import ModelSpec, Transformer, undrawn_weights

    try:
        spec = ModelSpec.from_config(ckpt.spec, int(ckpt.spec["vocab_size"]))
    except (ConfigError, KeyError) as e:
        raise UserError(f"ckpt: {ckpt.path / ckpt.spec_file} does not describe a model this llmlab can build ({e})") from e
    check_sizes_against_weights(spec, ckpt.weights, ckpt.path)
    try:
        with undrawn_weights():  # every weight is loaded below, or the checkpoint is refused
            model = Transformer(spec)
    except (RuntimeError, ValueError, TypeError, OverflowError, MemoryError) as e:
        raise UserError(f"ckpt: {ckpt.path / ckpt.spec_file} describes a model that cannot be built here "
                        f"({(str(e).strip().splitlines() or [type(e).__name__])[0][:160]})") from None
    if weights == "ema":
        average = ckpt.ema_weights()
        if average is None:
            raise UserError(f"weights: ema, but {ckpt.path} has no {EMA_FILE} (it was trained without train.ema); "
                            "use weights=raw")
        load_weights(model, average, ckpt.path / EMA_FILE, "its model.json")
    else:
        load_weights(model, ckpt.weights, ckpt.path, f"its {ckpt.spec_file}")
    tokenizer = ckpt.tokenizer()
    check_vocab(tokenizer.vocab_size, spec.vocab_size, ckpt.path)
    data = ckpt.config.get("data") if isinstance(ckpt.config, dict) else None
    if isinstance(data, dict) and data.get("doc_mask") is True:  # trained inside documents: scored so too
        model.doc_eos = tokenizer.eos_id
    return model.to(device).eval()


def check_sizes_against_weights(spec, weights: Mapping[str, torch.Tensor], where: Path) -> None:
    """model.json's vocabulary, width and depth against the weights file's own shapes, before
    anything is allocated from them: an edited size (a vocabulary of 2^70, a thousand layers)
    is one line, not an allocation that fails or fills the memory."""
    embed = weights.get("embed.weight")
    m = spec.model
    if embed is not None and embed.dim() == 2:
        if m.d_model != embed.shape[1]:
            raise UserError(f"ckpt: {where / 'model.json'}: model.d_model is {m.d_model:,} but embed.weight in "
                            f"model.safetensors is {embed.shape[1]:,} wide; the checkpoint is damaged or was edited")
        if spec.vocab_size > embed.shape[0]:
            raise UserError(f"ckpt: {where / 'model.json'}: vocab_size is {spec.vocab_size:,} but embed.weight in "
                            f"model.safetensors has {embed.shape[0]:,} rows; the checkpoint is damaged or was edited")
    blocks = {int(k.split(".")[1]) for k in weights if k.startswith("blocks.") and k.split(".")[1].isdigit()}
    if blocks and m.n_layers != len(blocks):
        raise UserError(f"ckpt: {where / 'model.json'}: model.n_layers is {m.n_layers:,} but model.safetensors holds "
                        f"{len(blocks):,} blocks; the checkpoint is damaged or was edited")


def check_vocab(tokenizer_vocab: int, model_vocab: int, where: Path) -> None:
    """A tokenizer with ids past the model's embedding table would index out of it."""
    if tokenizer_vocab > model_vocab:
        raise UserError(f"ckpt: {where}: its tokenizer.json has {tokenizer_vocab:,} ids but the model embeds only "
                        f"{model_vocab:,}; the tokenizer belongs to another model")
