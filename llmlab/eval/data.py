"""The tokens an evaluation scores, always encoded with the checkpoint's own tokenizer."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np

from llmlab.data.documents import pieces, read_file
from llmlab.data.prepare import Prepared, cache_root, prepare
from llmlab.errors import UserError


def eval_tokens(ckpt, cfg: dict[str, Any]) -> tuple[np.ndarray, int, str]:
    """(tokens, source bytes they encode, a description) for ``text=``, ``data=`` or the
    checkpoint's own validation split."""
    tok = ckpt.tokenizer()
    if cfg.get("text"):
        path = Path(str(cfg["text"])).expanduser()
        if not path.is_file():
            raise UserError(f"text: {path} is not a file")
        doc = read_file(path)
        ids = [i for p in tok.encode_batch(pieces(doc.text)) for i in p]
        return np.asarray(ids, dtype=np.int64), doc.nbytes, str(path)
    split = cfg.get("split", "val")
    prepared = _same_data_entry(ckpt, cfg)
    if prepared is None:
        data = cfg.get("data") or trusted_data(ckpt)
        prepared = prepare(data, {"kind": "pretrained", "path": str(ckpt.tokenizer_path), "eos": tok.eos},
                           cfg.get("cache_dir"))
    return prepared.tokens(split), prepared.meta[split]["bytes"], f"{prepared.meta['settings']['data']['kind']}:{split}"


def trusted_data(ckpt) -> dict[str, Any]:
    """The checkpoint's own data settings, where following them opens no path the checkpoint
    names: a checkpoint is data from elsewhere, and its config.yaml could name any local file
    (~/.ssh/id_rsa). Only this interpreter's standard library (``data=pysource`` without a
    root) qualifies; for anything else the user names the data."""
    data = ckpt.config.get("data") if isinstance(ckpt.config.get("data"), dict) else {}
    if data.get("kind") == "pysource" and not data.get("root"):
        return data
    shown = ", ".join(f"data.{k}={v}" for k, v in data.items() if k != "kind")
    raise UserError(f"data: the data {ckpt.path} was trained on is not prepared here, and a path a checkpoint names "
                    f"is never opened unless you name it; pass data={data.get('kind', '<kind>')} with its settings "
                    f"on the command line (the checkpoint records {shown or 'no settings'}), or text=<file>")


def _same_data_entry(ckpt, cfg) -> Prepared | None:
    """The cache entry the run trained on, if it is here and used this exact tokenizer."""
    import json
    key = ckpt.state.get("data_key")
    # a plain entry name: a checkpoint's state.json must not point the cache anywhere else
    if cfg.get("data") is not None or not isinstance(key, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", key):
        return None
    entry = cache_root(cfg.get("cache_dir")) / key
    try:
        same = _digest(entry / "tokenizer.json") == _digest(ckpt.tokenizer_path)
        return Prepared(entry, json.loads((entry / "meta.json").read_text())) if same else None
    except OSError:
        return None


def _digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
