"""Token shards on disk: a flat array of token ids per split, read back as np.memmap."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


class ShardWriter:
    """Appends token ids to ``path`` in the given dtype; counts what it wrote."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.dtype = Path(path), np.dtype(dtype)
        self.file = open(self.path, "wb")
        self.count = 0

    def write(self, ids) -> None:
        arr = np.asarray(ids, dtype=self.dtype)
        arr.tofile(self.file)
        self.count += arr.size

    def close(self) -> None:
        self.file.flush()
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_shard(path: Path, dtype: str | np.dtype) -> np.ndarray:
    path = Path(path)
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=np.dtype(dtype), mode="r")
