"""The ``data=hf`` kind."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from llmlab.data.corpus import CORPUS, Corpus, files_fingerprint, row_fractions
from llmlab.data.documents import Document
from llmlab.errors import ConfigError, UserError


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
        return {"path": self.cfg.path, **(files_fingerprint(files) if files else {})}
