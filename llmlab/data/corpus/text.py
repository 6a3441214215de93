"""The ``data=text`` kind."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any

from llmlab.data.corpus import CORPUS, Corpus, files_fingerprint, no_file, path_order
from llmlab.errors import ConfigError, UserError
from llmlab.registry import Checked


@CORPUS.register("text")
class TextFiles(Corpus):
    """Plain text files by path or glob (``**`` recurses), split by file; one file is split at a line."""

    @dataclass
    class Config(Corpus.Config, Checked):
        kind: str = "text"
        paths: Any = field(default_factory=list)  # a file or glob, or a list of them: [a.txt,'notes/**/*.md']
        val_fraction: float = 0.1  # one file alone is split at a line val_fraction from its end

        def check(self, prefix: str) -> None:
            if not (isinstance(self.paths, (str, int, float)) or (
                    isinstance(self.paths, list) and all(isinstance(p, (str, int, float)) for p in self.paths))):
                raise ConfigError(f"{prefix}.paths: expected a path or a list of paths, got {self.paths!r}")
            if not self.paths and self.paths != 0:
                raise ConfigError(f"{prefix}.paths: no files given; set {prefix}.paths=[file.txt,'dir/**/*.md']")

    def files(self) -> list[str]:
        paths = self.cfg.paths
        patterns = [str(p) for p in (paths if isinstance(paths, list) else [paths])]
        if not patterns:
            raise ConfigError("data.paths: no files given; set data.paths=[file.txt,'dir/**/*.md']")
        found: set[str] = set()
        for written in patterns:  # each names at least one file: a typo among several was dropped in silence
            pattern = os.path.expanduser(written)
            matches = glob.iglob(pattern, recursive=True) if glob.has_magic(pattern) else [pattern]
            files = {os.path.realpath(m) for m in matches if os.path.isfile(m)}
            if not files:
                raise UserError(f"data.paths: {no_file(written, pattern)}")
            found |= files
        return sorted(found, key=path_order)

    def fingerprint(self) -> dict[str, Any]:
        return files_fingerprint(self._listed())
