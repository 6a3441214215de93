"""The tokens an evaluation scores, always encoded with the checkpoint's own tokenizer."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from llmlab.data.batches import check_ids
from llmlab.data.documents import pieces, read_file
from llmlab.data.prepare import Prepared, cache_root, prepare
from llmlab.errors import UserError


def eval_tokens(ckpt, text: str | None = None, split: str = "val", data: Any = None,
                cache_dir: str | None = None) -> tuple[np.ndarray, int, str]:
    """(tokens, source bytes they encode, a description) for ``text`` (a file), ``data`` (a
    corpus's Config) or the checkpoint's own data, its ``split``."""
    tok = ckpt.tokenizer()
    if text:
        path = Path(os.path.expanduser(text))
        if not path.is_file():
            raise UserError(f"text: {path} is not a file")
        doc = read_file(path)
        if doc.repaired:
            from llmlab import console
            console.err.print(f"text: {doc.repaired:,} byte sequences of {path} are not UTF-8 and are scored as U+FFFD "
                              "(the replacement character)", style="yellow", highlight=False)
        ids = [i for p in tok.encode_batch(pieces(doc.text)) for i in p]
        return np.asarray(ids, dtype=np.int64), doc.nbytes, str(path)
    prepared = _same_data_entry(ckpt, cache_dir) if data is None else None
    if prepared is None:
        prepared = prepare(data or trusted_data(ckpt),
                           {"kind": "pretrained", "path": str(ckpt.tokenizer_path), "eos": tok.eos}, cache_dir)
    tokens = prepared.tokens(split)
    check_ids(tokens, prepared.vocab_size, f"{prepared.path} ({split} split)")
    return tokens, prepared.meta[split]["bytes"], f"{prepared.meta['settings']['data']['kind']}:{split}"


def trusted_data(ckpt) -> dict[str, Any]:
    """The checkpoint's own data settings, where following them opens no path the checkpoint
    names: a checkpoint is data from elsewhere, and its config.yaml could name any local file
    (~/.ssh/id_rsa). Only this interpreter's standard library (``data=pysource`` without a
    root) qualifies; for anything else the user names the data."""
    data = ckpt.config.get("data") if isinstance(ckpt.config.get("data"), dict) else {}
    if data.get("kind") == "pysource" and not data.get("root"):
        return data
    if getattr(ckpt, "spec_file", "") == "config.json":
        raise UserError(f"data: {ckpt.path} is a transformers directory, which records no training data; pass data=<kind> "
                        "with its settings (data=pysource: this Python's standard library), or text=<file>")
    shown = ", ".join(f"data.{k}={v}" for k, v in data.items() if k != "kind")
    raise UserError(f"data: the data {ckpt.path} was trained on is not prepared here, and a path a checkpoint names "
                    f"is never opened unless you name it; pass data={data.get('kind', '<kind>')} with its settings "
                    f"on the command line (the checkpoint records {shown or 'no settings'}), or text=<file>")


def _same_data_entry(ckpt, cache_dir: str | None) -> Prepared | None:
    """The cache entry the run trained on, if it is here and used this exact tokenizer."""
    import json
    key = ckpt.state.get("data_key")
    # a plain entry name: a checkpoint's state.json must not point the cache anywhere else
    if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", key):
        return None
    entry = cache_root(cache_dir) / key
    try:
        same = _digest(entry / "tokenizer.json") == _digest(ckpt.tokenizer_path)
        return Prepared(entry, json.loads((entry / "meta.json").read_text())) if same else None
    except OSError:
        return None


def _digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
