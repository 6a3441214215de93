"""Corpora (config group ``data``): where the text comes from, split into train and val.

A corpus yields documents. Splits are by document and deterministic: documents are ordered
by a hash of their name and the first ``val_fraction`` of that order is validation. A corpus
of a single document is split at a line near the end instead.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmlab.errors import ConfigError, UserError
from llmlab.registry import Registry

CORPUS = Registry("data", group="data")


@dataclass
class Document:
    name: str
    text: str
    nbytes: int  # bytes of the source as stored, before any decoding repair


@dataclass
class Split:
    train: list[Document]
    val: list[Document]

    def summary(self) -> dict[str, int]:
        return {"train_docs": len(self.train), "val_docs": len(self.val),
                "train_bytes": sum(d.nbytes for d in self.train), "val_bytes": sum(d.nbytes for d in self.val)}


def _rank(name: str) -> str:
    return hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()


def split_documents(docs: list[Document], val_fraction: float) -> Split:
    if not docs:
        raise UserError("data: the corpus is empty: no documents were found")
    if not any(d.text.strip() for d in docs):
        raise UserError(f"data: the corpus is empty: its {len(docs):,} documents hold no text")
    if len(docs) == 1:
        doc = docs[0]
        cut = int(len(doc.text) * (1 - val_fraction))
        newline = doc.text.find("\n", cut)
        cut = newline + 1 if 0 <= newline < len(doc.text) - 1 else cut
        head, tail = doc.text[:cut], doc.text[cut:]
        head_bytes = len(head.encode("utf-8", "surrogatepass"))
        # bytes of the stored source, split in proportion where decoding repaired anything
        return Split([Document(doc.name, head, min(head_bytes, doc.nbytes))],
                     [Document(doc.name + ":val", tail, doc.nbytes - min(head_bytes, doc.nbytes))])
    order = sorted(docs, key=lambda d: _rank(d.name))
    n_val = min(len(docs) - 1, max(1, round(val_fraction * len(docs))))
    val = sorted(order[:n_val], key=lambda d: d.name)
    train = sorted(order[n_val:], key=lambda d: d.name)
    return Split(train, val)


def read_file(path: Path, root: Path | None = None) -> Document:
    raw = path.read_bytes()
    name = str(path.relative_to(root)) if root else str(path)
    # a few stdlib files are not UTF-8: repair the text, keep the honest byte count
    return Document(name, raw.decode("utf-8", errors="replace"), len(raw))


class Corpus:
    @dataclass
    class Config:
        kind: str = ""
        val_fraction: float = 0.05

        def check(self, prefix: str) -> None:
            if not 0 < self.val_fraction < 1:
                raise ConfigError(f"{prefix}.val_fraction: must be in (0, 1), got {self.val_fraction}")

    def __init__(self, cfg):
        self.cfg = cfg

    def documents(self) -> list[Document]:
        raise NotImplementedError

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this corpus's content, for the prepared-data cache key."""
        raise NotImplementedError

    def split(self) -> Split:
        return split_documents(self.documents(), self.cfg.val_fraction)


def _files_fingerprint(files: list[Path]) -> dict[str, Any]:
    h = hashlib.sha256()
    for p in files:
        st = p.stat()
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return {"files": len(files), "digest": h.hexdigest()[:16]}


@CORPUS.register("pysource")
class PythonSource(Corpus):
    """The ``*.py`` files of the running interpreter's standard library, tests left out."""

    SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})

    @dataclass
    class Config(Corpus.Config):
        kind: str = "pysource"
        root: str | None = None  # null: the running interpreter's stdlib directory

    def root(self) -> Path:
        return Path(self.cfg.root or sysconfig.get_paths()["stdlib"])

    def files(self) -> list[Path]:
        root = self.root()
        if not root.is_dir():
            raise UserError(f"data.root: {root} is not a directory")
        return sorted(p for p in root.rglob("*.py")
                      if not (set(p.relative_to(root).parts[:-1]) & self.SKIP_DIRS)
                      and not p.name.startswith("test_"))

    def documents(self) -> list[Document]:
        root = self.root()
        return [read_file(p, root) for p in self.files()]

    def fingerprint(self) -> dict[str, Any]:
        return {"root": str(self.root()), "python": sys.version.split()[0], **_files_fingerprint(self.files())}


@CORPUS.register("text")
class TextFiles(Corpus):
    """Plain text files by path or glob (``**`` recurses), split by file; one file is split at a line."""

    @dataclass
    class Config(Corpus.Config):
        kind: str = "text"
        paths: Any = field(default_factory=list)  # a file or glob, or a list of them: [a.txt,'notes/**/*.md']
        val_fraction: float = 0.1  # one file alone is split at a line val_fraction from its end

        def check(self, prefix: str) -> None:
            super().check(prefix)
            if isinstance(self.paths, (str, int, float)):
                self.paths = str(self.paths)
            elif not (isinstance(self.paths, list) and all(isinstance(p, (str, int, float)) for p in self.paths)):
                raise ConfigError(f"{prefix}.paths: expected a path or a list of paths, got {self.paths!r}")
            else:
                self.paths = [str(p) for p in self.paths]
            if not self.paths:
                raise ConfigError(f"{prefix}.paths: no files given; set {prefix}.paths=[file.txt,'dir/**/*.md']")

    def files(self) -> list[Path]:
        patterns = [self.cfg.paths] if isinstance(self.cfg.paths, str) else list(self.cfg.paths)
        if not patterns:
            raise ConfigError("data.paths: no files given; set data.paths=[file.txt,'dir/**/*.md']")
        found: set[Path] = set()
        for pattern in patterns:
            pattern = os.path.expanduser(pattern)
            matches = glob.glob(pattern, recursive=True) if glob.has_magic(pattern) else [pattern]
            found.update(Path(m).resolve() for m in matches if Path(m).is_file())
        if not found:
            raise UserError(f"data.paths: no files matched {patterns}")
        return sorted(found)

    def documents(self) -> list[Document]:
        return [read_file(p) for p in self.files()]

    def fingerprint(self) -> dict[str, Any]:
        return _files_fingerprint(self.files())


@CORPUS.register("hf")
class HFDataset(Corpus):
    """A Hugging Face `datasets` dataset by hub name or local path (json, parquet, csv, text,
    or a saved dataset directory). Rows of ``text_column`` are documents."""

    LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv",
                      ".txt": "text", ".arrow": "arrow"}

    @dataclass
    class Config(Corpus.Config):
        kind: str = "hf"
        path: str = ""  # a hub name (with a network), local json/jsonl/parquet/csv/txt files, or a saved dataset
        name: str | None = None  # the dataset's configuration name, if it has several
        split: str = "train"
        val_split: str | None = None  # a split to use as validation; null: hold out val_fraction of `split`
        text_column: str = "text"
        max_docs: int | None = None

    def _local_files(self) -> list[str]:
        """The local files ``data.path`` names (a file or a glob); [] for a hub name or a directory."""
        path = os.path.expanduser(self.cfg.path)
        matches = glob.glob(path) if glob.has_magic(path) else [path]
        return sorted(p for p in matches if os.path.isfile(p))

    def _load(self, split: str):
        import datasets

        path = os.path.expanduser(self.cfg.path)
        if not path:
            raise ConfigError("data.path: set a dataset name or a local file, e.g. data.path=corpus.jsonl")
        builder, kwargs = path, {}
        local = self._local_files()
        if local:
            suffixes = {Path(p).suffix for p in local}
            if len(suffixes) != 1 or suffixes.pop() not in self.LOCAL_BUILDERS:
                allowed = ", ".join(sorted(self.LOCAL_BUILDERS))
                raise UserError(f"data.path: local files must share one of the suffixes {allowed}")
            builder, kwargs = self.LOCAL_BUILDERS[Path(local[0]).suffix], {"data_files": local}
        elif os.path.isdir(path) and (Path(path) / "dataset_info.json").exists():
            ds = datasets.load_from_disk(path)
            return ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        verbosity = datasets.logging.get_verbosity()
        # the builder logs a malformed file's error as well as raising it: said once, below
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)
        try:
            return datasets.load_dataset(builder, self.cfg.name, split=split, **kwargs)
        except Exception as e:
            # a malformed local file (a JSONL line that is not JSON, say) fails inside the builder
            # with the library's own exception types; either way it is the data's fault
            if not (local or isinstance(e, (FileNotFoundError, ValueError, ConnectionError))):
                raise
            cause = e.__cause__ or e
            reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
            raise UserError(f"data.path: cannot load '{self.cfg.path}' split '{split}': {reason}") from e
        finally:
            datasets.logging.set_verbosity(verbosity)

    def _docs(self, split: str) -> list[Document]:
        ds = self._load(split)
        col = self.cfg.text_column
        if col not in ds.column_names:
            raise ConfigError(f"data.text_column: '{col}' is not a column; columns: {', '.join(ds.column_names)}")
        if self.cfg.max_docs is not None:
            ds = ds.select(range(min(self.cfg.max_docs, len(ds))))
        docs = []
        for i, text in enumerate(ds[col]):
            text = text or ""
            docs.append(Document(f"{split}/{i:09d}", text, len(text.encode("utf-8", "surrogatepass"))))
        return docs

    def documents(self) -> list[Document]:
        return self._docs(self.cfg.split)

    def split(self) -> Split:
        if self.cfg.val_split:
            train, val = self._docs(self.cfg.split), self._docs(self.cfg.val_split)
            if not train or not val:
                raise UserError(f"data.path: '{self.cfg.path}' has an empty split")
            return Split(train, val)
        return super().split()

    def fingerprint(self) -> dict[str, Any]:
        path = os.path.expanduser(self.cfg.path)
        files = [Path(p) for p in self._local_files()]
        if os.path.isdir(path):
            files = sorted(p for p in Path(path).rglob("*") if p.is_file())
        # a hub dataset is identified by its name and settings alone
        return {"path": self.cfg.path, **(_files_fingerprint(files) if files else {})}
