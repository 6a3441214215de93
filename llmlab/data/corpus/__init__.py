"""Corpora (config group ``data``): where the text comes from, split into train and val.

A corpus streams its documents, one at a time, so memory is bounded by the largest piece and
not by the corpus: a file larger than `PART_BYTES` arrives in parts, each cut where a cut
leaves byte-level BPE's pre-tokenization unchanged. Splits are by document, deterministic,
and decided per document without holding the corpus: a document is validation when a hash of
its name (of its row index, for a dataset) falls in the first ``val_fraction`` of the hash
range. When that leaves a split empty (a handful of documents), the document with the lowest
hash is validation and the one with the highest is training. A corpus of a single document
is split at the first line after ``1 - val_fraction`` of its bytes instead.

Each kind is one file in this package, its class registered with ``@CORPUS.register(name)``
and holding its nested ``Config``; the package finds them all (`llmlab.registry.discover`).
"""

from __future__ import annotations

import glob
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from llmlab.data.documents import Document, line_cut, read_parts, val_names
from llmlab.errors import UserError
from llmlab.registry import Registry, bounded, discover

CORPUS = Registry("data", group="data")
SPLITS = ("train", "val")
class Corpus:
    """A source of documents. A kind provides ``fingerprint`` and either ``files`` (a corpus
    of files, one document each) or its own ``stream`` and ``size``."""

    @dataclass
    class Config:
        kind: str = ""
        val_fraction: float = bounded(0.05, above=0, below=1)
        workers: int | None = bounded(None, at_least=1)  # processes that encode; null: every core (the tokens do not depend on it)
        shard_tokens: int = bounded(100_000_000, at_least=1)  # tokens per shard file of the prepared data (its layout, not its tokens)
        doc_mask: bool = False  # training windows: attention stays inside each document (a block-causal mask)

    def __init__(self, cfg):
        self.cfg = cfg
        self._files: list[str] | None = None  # plain strings: a Path holds its parts too, 3-4x the memory
        self._val: set[str] | None = None
        self._root: Path | None = None
        self._split: dict[str, list] = {}

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this corpus's content, for the prepared-data cache key."""
        raise NotImplementedError

    def files(self) -> list[str]:
        """The corpus's files, sorted, as plain path strings (a corpus may hold 10^5 files)."""
        raise NotImplementedError

    def name_of(self, path: str) -> str:
        """A document's name: its path below the directory that holds every file of the
        corpus, so the split does not change when the corpus moves."""
        if self._root is None:
            files = self._listed()
            self._root = Path(os.path.commonpath([os.path.dirname(p) for p in files])) if files else Path()
        return Path(path).relative_to(self._root).as_posix()

    def _listed(self) -> list[str]:
        if self._files is None:
            self._files = self.files()
            if not self._files:
                raise UserError("data: the corpus is empty: no documents were found")
        return self._files

    def _split_files(self, split: str) -> list[tuple[str, int, int | None]]:
        """(file, first byte, end byte or None) of each document of ``split``, in name order."""
        if split not in self._split:
            self._split[split] = self._files_of(split)
        return self._split[split]

    def _files_of(self, split: str) -> list[tuple[str, int, int | None]]:
        files = self._listed()
        if len(files) == 1:
            cut = line_cut(Path(files[0]), self.cfg.val_fraction)
            return [(files[0], 0, cut)] if split == "train" else [(files[0], cut, None)]
        if self._val is None:
            self._val = val_names([self.name_of(p) for p in files], self.cfg.val_fraction)
        want_val = split == "val"
        return [(p, 0, None) for p in files if (self.name_of(p) in self._val) == want_val]

    def stream(self, split: str) -> Iterator[Document]:
        """The documents (and parts of documents) of ``split``, always in the same order."""
        files = self._listed()
        for path, start, stop in self._split_files(split):
            name = self.name_of(path) + (":val" if len(files) == 1 and split == "val" else "")
            yield from read_parts(Path(path), name, start, stop)

    def size(self, split: str) -> int | None:
        """The split's bytes, where known before reading it (for progress and sampling)."""
        total = 0
        for path, start, stop in self._split_files(split):
            total += (os.path.getsize(path) if stop is None else stop) - start
        return total


def path_order(path: str) -> list[str]:
    """The order of `pathlib.Path` objects (part by part: ``a/b.py`` before ``a.b/c.py``) for
    plain strings, so the files, their fingerprint and the token stream keep their order."""
    return path.split(os.sep)


def files_fingerprint(files: list[str]) -> dict[str, Any]:
    h = hashlib.sha256()
    for p in files:
        st = os.stat(p)
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return {"files": len(files), "digest": h.hexdigest()[:16]}


def no_file(written: str, pattern: str) -> str:
    """Why ``data.paths`` entry ``written`` (``pattern`` once ``~`` is expanded) names no file."""
    if glob.has_magic(pattern):
        return f"'{written}' matches no file"
    if os.path.isdir(pattern):
        return f"{written} is a directory; name its files with a glob such as '{written.rstrip('/')}/**/*.txt'"
    if os.path.lexists(pattern):
        return f"{written} is not a regular file" + (" (a broken symbolic link)" if os.path.islink(pattern) else "")
    return f"{written} does not exist"


def row_fractions(start: int, stop: int) -> "Any":
    """`hash_fraction` for rows ``start..stop-1`` of a dataset, vectorised: splitmix64 of the
    row index, so a split of millions of rows is decided without naming each."""
    import numpy as np

    with np.errstate(over="ignore"):
        z = np.arange(start, stop, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


discover(__name__, __path__)  # every kind's file, each registering itself
