"""The tokens an evaluation scores, always encoded with the checkpoint's own tokenizer."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from llmlab.data.corpus import read_file
from llmlab.data.prepare import Prepared, cache_root, pieces, prepare
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
        data = cfg.get("data") or ckpt.config.get("data")
        prepared = prepare(data, {"kind": "pretrained", "path": str(ckpt.tokenizer_path), "eos": tok.eos},
                           cfg.get("cache_dir"))
    return prepared.tokens(split), prepared.meta[split]["bytes"], f"{prepared.meta['settings']['data']['kind']}:{split}"


def _same_data_entry(ckpt, cfg) -> Prepared | None:
    """The cache entry the run trained on, if it is here and used this exact tokenizer."""
    import json
    if cfg.get("data") is not None or not ckpt.state.get("data_key"):
        return None
    entry = cache_root(cfg.get("cache_dir")) / ckpt.state["data_key"]
    try:
        same = _digest(entry / "tokenizer.json") == _digest(ckpt.tokenizer_path)
        return Prepared(entry, json.loads((entry / "meta.json").read_text())) if same else None
    except OSError:
        return None


def _digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
