"""The ``tokenizer=pretrained`` kind."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmlab.data.tokenizer import EOS, TOKENIZER, TextTokenizer, TokenizerFactory
from llmlab.errors import UserError


@TOKENIZER.register("pretrained")
class PretrainedTokenizer(TokenizerFactory):
    """A ``tokenizer.json`` from elsewhere (a Hugging Face model directory, another run)."""

    @dataclass
    class Config:
        kind: str = "pretrained"
        path: str = ""
        eos: str | None = EOS

    def _path(self) -> Path:
        path = Path(os.path.expanduser(self.cfg.path))
        if path.is_dir():
            path = path / "tokenizer.json"
        if not self.cfg.path or not path.is_file():
            raise UserError(f"tokenizer.path: no tokenizer.json at '{self.cfg.path}'")
        return path

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": "pretrained", "eos": self.cfg.eos,
                "sha256": hashlib.sha256(self._path().read_bytes()).hexdigest()[:16]}

    def make(self, texts=None) -> TextTokenizer:
        return TextTokenizer.load(self._path(), self.cfg.eos)
