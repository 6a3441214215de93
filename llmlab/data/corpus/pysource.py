"""The ``data=pysource`` kind."""

from __future__ import annotations

import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmlab.data.corpus import CORPUS, Corpus, files_fingerprint, path_order
from llmlab.errors import UserError


@CORPUS.register("pysource")
class PythonSource(Corpus):
    """The ``*.py`` files of the running interpreter's standard library, tests left out."""

    SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})

    @dataclass
    class Config(Corpus.Config):
        kind: str = "pysource"
        root: str | None = None  # null: the running interpreter's stdlib directory

    def root(self) -> Path:
        if self._root is None:
            self._root = Path(self.cfg.root or sysconfig.get_paths()["stdlib"])
        return self._root

    def files(self) -> list[str]:
        root = self.root()
        if not root.is_dir():
            raise UserError(f"data.root: {root} is not a directory")
        return sorted((str(p) for p in root.rglob("*.py")
                       if not (set(p.relative_to(root).parts[:-1]) & self.SKIP_DIRS)
                       and not p.name.startswith("test_")), key=path_order)

    def name_of(self, path: str) -> str:
        return Path(path).relative_to(self.root()).as_posix()

    def fingerprint(self) -> dict[str, Any]:
        return {"root": str(self.root()), "python": sys.version.split()[0], **files_fingerprint(self._listed())}
