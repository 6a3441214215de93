"""Corpora (config group ``data``): where the text comes from, split into train and val.

A corpus streams its documents, one at a time, so memory is bounded by the largest piece and
not by the corpus: a file larger than `PART_BYTES` arrives in parts, each cut where a cut
leaves byte-level BPE's pre-tokenization unchanged. Splits are by document, deterministic,
and decided per document without holding the corpus: a document is validation when a hash of
its name (of its row index, for a dataset) falls in the first ``val_fraction`` of the hash
range. When that leaves a split empty (a handful of documents), the document with the lowest
hash is validation and the one with the highest is training. A corpus of a single document
is split at the first line after ``1 - val_fraction`` of its bytes instead.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from llmlab.data.documents import Document, line_cut, read_parts, val_names
from llmlab.errors import ConfigError, UserError
from llmlab.registry import Checked, Registry, bounded

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


def _files_fingerprint(files: list[str]) -> dict[str, Any]:
    h = hashlib.sha256()
    for p in files:
        st = os.stat(p)
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
        return {"root": str(self.root()), "python": sys.version.split()[0], **_files_fingerprint(self._listed())}


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
                raise UserError(f"data.paths: {_no_file(written, pattern)}")
            found |= files
        return sorted(found, key=path_order)

    def fingerprint(self) -> dict[str, Any]:
        return _files_fingerprint(self._listed())


def _no_file(written: str, pattern: str) -> str:
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


@CORPUS.register("hf")
class HFDataset(Corpus):
    """A Hugging Face `datasets` dataset by hub name or local path (json, parquet, csv, text,
    or a saved dataset directory). Rows of ``text_column`` are documents, read in Arrow
    batches from the memory-mapped dataset, never as one column in memory."""

    LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv",
                      ".txt": "text", ".arrow": "arrow"}
    BATCH_ROWS = 1000

    @dataclass
    class Config(Corpus.Config):
        kind: str = "hf"
        path: str = ""  # a hub name (with a network), local json/jsonl/parquet/csv/txt files, or a saved dataset
        name: str | None = None  # the dataset's configuration name, if it has several
        split: str = "train"
        val_split: str | None = None  # a split to use as validation; null: hold out val_fraction of `split`
        text_column: str = "text"
        max_docs: int | None = None

    def __init__(self, cfg):
        super().__init__(cfg)
        self._datasets: dict[str, Any] = {}
        self._edges: tuple[int, int] | None = None

    def _local_files(self) -> list[str]:
        """The local files ``data.path`` names (a file or a glob); [] for a hub name or a directory."""
        path = os.path.expanduser(self.cfg.path)
        matches = glob.glob(path) if glob.has_magic(path) else [path]
        return sorted(p for p in matches if os.path.isfile(p))

    def _load(self, split: str):
        if split in self._datasets:
            return self._datasets[split]
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
            if all(os.path.getsize(p) == 0 for p in local):  # the builder's bare StopIteration otherwise
                files = "its files are" if len(local) > 1 else "the file is"
                raise UserError(f"data.path: '{self.cfg.path}' holds no rows: {files} empty")
        elif glob.has_magic(path) or (Path(path).suffix in self.LOCAL_BUILDERS and not os.path.exists(path)):
            # meant as local files (a hub name has no glob and no file suffix): not a hub lookup
            what = "matches no file" if glob.has_magic(path) else "does not exist"
            raise UserError(f"data.path: '{self.cfg.path}' {what} (a local file; a hub dataset is named without a "
                            "suffix, such as wikitext)")
        elif os.path.isdir(path) and (Path(path) / "dataset_info.json").exists():
            ds = datasets.load_from_disk(path)
            return self._checked(split, ds[split] if isinstance(ds, datasets.DatasetDict) else ds)
        verbosity = datasets.logging.get_verbosity()
        # the builder logs a malformed file's error as well as raising it: said once, below
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)
        try:
            ds = datasets.load_dataset(builder, self.cfg.name, split=split, **kwargs)
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
        return self._checked(split, ds)

    def _checked(self, split: str, ds):
        col = self.cfg.text_column
        if col not in ds.column_names:
            raise ConfigError(f"data.text_column: '{col}' is not a column; columns: {', '.join(ds.column_names)}")
        feature = ds.features[col]
        if getattr(feature, "dtype", None) not in ("string", "large_string"):
            kind = getattr(feature, "dtype", None) or type(feature).__name__
            texts = [c for c, f in ds.features.items() if getattr(f, "dtype", None) in ("string", "large_string")]
            raise ConfigError(f"data.text_column: '{col}' holds {kind}, not text; the text columns: "
                              f"{', '.join(texts) or 'none'}")
        ds = ds.select_columns([col])
        if self.cfg.max_docs is not None:
            ds = ds.select(range(min(self.cfg.max_docs, len(ds))))
        if len(ds) == 0:
            raise UserError(f"data.path: '{self.cfg.path}' has an empty split '{split}'")
        nulls = sum(rows.column(col).null_count for rows in ds.with_format("arrow").iter(batch_size=1 << 16))
        if nulls:  # said once per split (a spawned worker gets this corpus with its splits loaded)
            from llmlab import console
            console.err.print(f"data: {nulls:,} of the {len(ds):,} rows of '{self.cfg.path}' split '{split}' have no "
                              f"{col} (null): read as empty documents", style="yellow", highlight=False)
        self._datasets[split] = ds
        return ds

    def _rows_are_val(self, start: int, stop: int) -> "Any":
        """Which rows of ``start..stop-1`` are validation, with `val_names`'s guarantee that
        neither split is empty (the lowest and highest hash over all rows decide it)."""
        n = len(self._load(self.cfg.split))
        if self._edges is None:
            count, low, high = 0, (2.0, 0), (-1.0, 0)
            for first in range(0, n, 1 << 20):
                f = row_fractions(first, min(n, first + (1 << 20)))
                count += int((f < self.cfg.val_fraction).sum())
                low = min(low, (float(f.min()), first + int(f.argmin())))
                high = max(high, (float(f.max()), first + int(f.argmax())))
            self._edges = (low[1] if count == 0 else -1, high[1] if count == n else -1)
        f = row_fractions(start, stop)
        val = f < self.cfg.val_fraction
        force_val, force_train = self._edges
        if start <= force_val < stop:
            val[force_val - start] = True
        if start <= force_train < stop:
            val[force_train - start] = False
        return val

    def _source(self, split: str):
        """(dataset, whether val is held out of it by hash) for ``split``."""
        held_out = not self.cfg.val_split
        ds = self._load(self.cfg.val_split if split == "val" and not held_out else self.cfg.split)
        if held_out and len(ds) < 2:
            raise UserError(f"data.path: '{self.cfg.path}' has one row; give more documents or set data.val_split")
        return ds, held_out

    def stream(self, split: str) -> Iterator[Document]:
        """Rows in Arrow batches of `BATCH_ROWS`."""
        ds, held_out = self._source(split)
        col = self.cfg.text_column
        for first in range(0, len(ds), self.BATCH_ROWS):
            stop = min(len(ds), first + self.BATCH_ROWS)
            is_val = self._rows_are_val(first, stop) if held_out else None
            for i, text in enumerate(ds[first:stop][col]):
                if is_val is not None and bool(is_val[i]) != (split == "val"):
                    continue
                text = text or ""
                yield Document(f"{split}/{first + i:09d}", text, len(text.encode("utf-8", "surrogatepass")))

    def size(self, split: str) -> int | None:
        """An estimate from the Arrow column's size (strings and offsets), for progress."""
        ds, held_out = self._source(split)
        try:
            column = ds.data.table.column(self.cfg.text_column)
            total = column.nbytes * len(ds) / max(1, len(column))
        except Exception:  # another Arrow layout: no estimate
            return None
        share = (self.cfg.val_fraction if split == "val" else 1 - self.cfg.val_fraction) if held_out else 1.0
        return int(total * share)

    def fingerprint(self) -> dict[str, Any]:
        path = os.path.expanduser(self.cfg.path)
        files = [Path(p) for p in self._local_files()]
        if os.path.isdir(path):
            files = sorted(p for p in Path(path).rglob("*") if p.is_file())
        # a hub dataset is identified by its name and settings alone
        return {"path": self.cfg.path, **(_files_fingerprint(files) if files else {})}
