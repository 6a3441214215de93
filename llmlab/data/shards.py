"""Token shards on disk: each split is a directory of flat token files (``000000.bin``, ...)
plus their index in meta.json (tokens, bytes and documents per shard), read back as one
sequence. Offsets are int64 throughout, so a split may hold more than 2^32 tokens."""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from llmlab.files import open_fresh, own_dir

def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def shard_name(index: int) -> str:
    return f"{index:06d}.bin"


class ShardWriter:
    """Appends token ids to ``path`` in the given dtype; counts what it wrote."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.dtype = Path(path), np.dtype(dtype)
        self.file = open_fresh(self.path)
        self.count = 0
        self.crc = 0  # CRC-32 of the bytes written so far (`shard_crc` reads a file back the same way)

    def write(self, ids) -> None:
        arr = np.ascontiguousarray(ids, dtype=self.dtype)
        arr.tofile(self.file)
        self.crc = zlib.crc32(memoryview(arr).cast("B"), self.crc)
        self.count += arr.size

    def close(self, sync: bool = False) -> None:
        self.file.flush()
        if sync:
            os.fsync(self.file.fileno())
        self.file.close()


class SplitWriter:
    """A split's shards, written in ``directory``, each closed at the first batch boundary past
    ``shard_tokens`` tokens: a shard is written under a temporary name
    and renamed when finished, so a shard file with a final name is always whole. ``done``:
    the index entries of shards already finished (a resumed build continues after them)."""

    def __init__(self, directory: Path, dtype: np.dtype, shard_tokens: int, done: list[dict[str, Any]] | None = None):
        self.directory, self.dtype, self.shard_tokens = Path(directory), np.dtype(dtype), shard_tokens
        own_dir(self.directory)
        self.shards = list(done or [])
        keep = {s["file"] for s in self.shards}
        for p in self.directory.iterdir():  # a half-written shard, or one after the last recorded
            if p.name not in keep:
                p.unlink()
        self.writer: ShardWriter | None = None
        self.bytes = self.docs = self.repaired = 0

    def write(self, ids: np.ndarray, nbytes: int, docs: int, repaired: int = 0) -> None:
        """``repaired``: byte sequences of the text that were not UTF-8 (read as U+FFFD)."""
        if self.writer is None:
            self.writer = ShardWriter(self.directory / f".{shard_name(len(self.shards))}.tmp", self.dtype)
        self.writer.write(ids)
        self.bytes += nbytes
        self.docs += docs
        self.repaired += repaired

    def full(self) -> bool:
        return self.writer is not None and self.writer.count >= self.shard_tokens

    def finish_shard(self, position: int) -> dict[str, Any] | None:
        """Close the open shard (synced, renamed); ``position``: how far into the split's
        stream it reaches, for a resume. Returns its index entry (None: nothing was open)."""
        if self.writer is None:
            return None
        self.writer.close(sync=True)
        name = shard_name(len(self.shards))
        os.replace(self.writer.path, self.directory / name)
        entry = {"file": name, "tokens": self.writer.count, "bytes": self.bytes, "docs": self.docs,
                 "crc32": self.writer.crc, "position": position}
        if self.repaired:
            entry["repaired"] = self.repaired
        self.shards.append(entry)
        self.writer, self.bytes, self.docs, self.repaired = None, 0, 0, 0
        return entry


def shard_crc(path: Path, chunk: int = 1 << 24) -> int:
    """CRC-32 of a shard file's bytes, read in 16 MB pieces (about 1 GB/s: a check of what
    changed on disk, not a defence against a crafted file)."""
    crc = 0
    with open(path, "rb") as f:
        while piece := f.read(chunk):
            crc = zlib.crc32(piece, crc)
    return crc


def read_shard(path: Path, dtype: str | np.dtype) -> np.ndarray:
    path = Path(path)
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=np.dtype(dtype), mode="r")


class TokenStore:
    """A split's tokens over its shards, read as one sequence: ``len``, slices (copied into
    one array; a slice may span shards) and single ids. Each shard is a memory map."""

    def __init__(self, arrays: list[np.ndarray]):
        self.arrays = [a for a in arrays if len(a)] or [np.zeros(0, dtype=arrays[0].dtype if arrays else np.uint16)]
        self.offsets = np.cumsum([0, *(len(a) for a in self.arrays)], dtype=np.int64)
        self.dtype = self.arrays[0].dtype

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise IndexError("TokenStore: slices with a step are not supported")
            return self._range(start, max(start, stop))
        index = int(key) + (len(self) if int(key) < 0 else 0)
        if not 0 <= index < len(self):
            raise IndexError(f"token {key} of {len(self)}")
        i = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return self.arrays[i][index - self.offsets[i]]

    def _range(self, start: int, stop: int) -> np.ndarray:
        i = int(np.searchsorted(self.offsets, start, side="right")) - 1
        if i < len(self.arrays) and stop <= self.offsets[i + 1]:  # within one shard: the usual case
            base = int(self.offsets[i])
            return np.asarray(self.arrays[i][start - base:stop - base])
        parts = []
        while start < stop and i < len(self.arrays):
            base, end = int(self.offsets[i]), int(self.offsets[i + 1])
            parts.append(np.asarray(self.arrays[i][start - base:min(stop, end) - base]))
            start, i = min(stop, end), i + 1
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self._range(0, len(self))
        return whole if dtype is None else whole.astype(dtype)
