"""``llmlab train init=<source>``: start a run from another model's weights, an llmlab
checkpoint (or a run directory: its newest checkpoint) or a `transformers` directory of the
families llmlab exports.

The source decides the network and the tokenizer: the run's model sections (``model``,
``attention``, ``ffn``, ``norm``, ``pos``, ``objective``) become the source's, and its
tokenizer becomes ``tokenizer=pretrained`` on the source's tokenizer.json, so the run's
config.yaml and run id say what trained. A command-line setting that says otherwise
(``model.d_model=128`` against a source 64 wide) is one line naming both; the optimizer,
the schedule and the step count start fresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from llmlab.errors import ConfigError, UserError

# the sections the source decides, and the config groups that choose them
SECTIONS = ("model", "attention", "ffn", "norm", "pos", "objective", "tokenizer")
GROUPS = {"model": "model", "model/attention": "attention", "model/ffn": "ffn", "norm": "norm", "pos": "pos",
          "objective": "objective", "tokenizer": "tokenizer"}


@dataclass(frozen=True)
class InitSource:
    path: Path  # the checkpoint directory or transformers directory the weights come from
    spec: dict  # model.json's sections, every setting filled in
    spec_file: str  # model.json or config.json
    tokenizer: dict  # the run's tokenizer section: pretrained, on the source's tokenizer.json


def _tokenizer_ids(path: Path) -> int:
    """How many ids the tokenizer at ``path`` gives, its added tokens counted."""
    from llmlab.data.tokenizer import TextTokenizer

    try:
        return TextTokenizer.load(path, eos=None).vocab_size
    except UserError as e:
        raise UserError(f"init: {e}") from None


def init_source(value: str) -> InitSource:
    """The source ``init=`` names, its architecture read (and checked) without its weights."""
    import os

    from llmlab.export.hf_load import eos_token, is_hf_dir, read_config
    from llmlab.model.config import ModelSpec
    from llmlab.train.checkpoint import (check_described, check_model_json, is_checkpoint_dir, json_object,
                                         list_checkpoints)
    from llmlab.train.recovery import completeness

    path = Path(os.path.expanduser(str(value)))
    if not path.exists():
        raise UserError(f"init: {path} does not exist")
    check_described(path, "init")
    if is_hf_dir(path):
        _, spec, config = read_config(path)
        spec_file, eos = "config.json", eos_token(path, config)
    else:
        if not is_checkpoint_dir(path):
            found = list_checkpoints(path / "checkpoints")
            if not found:
                raise UserError(f"init: {path} is neither a checkpoint, a run directory with checkpoints/, nor a "
                                "transformers directory (config.json)")
            path = found[-1]
        problem = completeness(path)
        if problem is not None:
            raise UserError(f"init: {path} is not a complete checkpoint ({problem})")
        try:
            spec = check_model_json(json_object(path / "model.json"), path / "model.json")
            eos = json_object(path / "state.json").get("eos")
        except UserError as e:
            raise UserError("init: " + str(e).removeprefix("ckpt: ")) from None
        except ValueError as e:
            raise UserError(f"init: {path} has an unreadable metadata file ({type(e).__name__})") from None
        spec_file = "model.json"
    if not (path / "tokenizer.json").is_file():
        raise UserError(f"init: {path} has no tokenizer.json")
    ids = _tokenizer_ids(path / "tokenizer.json")
    if isinstance(spec.get("vocab_size"), int) and ids > spec["vocab_size"] > 0:  # else refused below
        # its ids index the embedding table: checked here, before the data is tokenized with it
        raise UserError(f"init: {path}: its tokenizer.json has {ids:,} ids but the model embeds only "
                        f"{spec['vocab_size']:,}; the tokenizer belongs to another model")
    try:
        full = ModelSpec.from_config(spec, int(spec["vocab_size"])).to_dict()
    except ConfigError as e:
        raise UserError(f"init: {path / spec_file} does not describe a model this llmlab can build ({e})") from None
    if full["objective"]["kind"] != "clm":
        raise UserError(f"init: {path} was trained with objective={full['objective']['kind']}; init= continues a causal LM")
    eos = eos if isinstance(eos, str) else None
    return InitSource(path, full, spec_file, {"kind": "pretrained", "path": str(path / "tokenizer.json"), "eos": eos})


def with_init(cfg: Mapping[str, Any], source: InitSource) -> dict:
    """``cfg`` with the sections the source decides replaced by the source's."""
    out = dict(cfg)
    for section in SECTIONS[:-1]:
        out[section] = dict(source.spec[section])
    out["tokenizer"] = dict(source.tokenizer)
    return out


def _lookup(cfg: Mapping[str, Any], key: str) -> Any:
    value: Any = cfg
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def check_overrides(overrides: list[str], composed: Mapping[str, Any], source: InitSource) -> None:
    """A command-line setting of a section the source decides must agree with the source.
    ``composed``: the config as composed, before the source replaced those sections."""
    decided = with_init(composed, source)
    for text in overrides:
        key, eq, _ = text.lstrip("+~").partition("=")
        if not eq:
            continue
        if key in GROUPS:  # a group option: every setting of the section(s) it fills
            sections = SECTIONS[:-1] if key == "model" else (GROUPS[key],)
            keys = sorted((f"{s}.{k}" for s in sections for k in (composed.get(s) or {})),
                          key=lambda k: k == "model.name")  # the label last: a size or kind says more
        elif key.split(".")[0] in SECTIONS:
            keys = [key]
        else:
            continue
        for k in keys:
            ours, theirs = _lookup(composed, k), _lookup(decided, k)
            if ours != theirs:
                where = "tokenizer.json" if k.startswith("tokenizer.") else source.spec_file
                raise UserError(f"{key}: init={source.path} decides the network and tokenizer, and {k} is {theirs!r} "
                                f"there (its {where}), not {ours!r}; drop {text}, or init=")
