"""Encoding in parallel: batches of text become token ids in worker processes, each running the
Rust tokenizer on its own batches with one thread, and the results come back in the order the
batches went out. So the tokens never depend on the number of workers, and memory holds at most
two batches per worker in flight."""

from __future__ import annotations

import contextlib
import os
from collections import deque
from typing import Any, Iterable, Iterator

import numpy as np

_state: dict[str, Any] = {}


def _start(tokenizer: Any, eos_id: int | None, dtype: str, one_thread: bool = True) -> None:
    """Load the tokenizer (a `tokenizers.Tokenizer`, or its JSON in a worker) in this process,
    its engine on one thread (``data.workers`` counts the cores) unless ``one_thread`` is False."""
    if one_thread:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if isinstance(tokenizer, str):
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(tokenizer)
    _state.update(tok=tokenizer, eos_id=eos_id, dtype=np.dtype(dtype))


SLICE_CHARS = 1 << 16  # text per call of the engine: what it returns (an Encoding per text) is held this long


def encode_texts(texts: list[str], ends: list[bool]) -> np.ndarray:
    """Token ids of ``texts`` in order, the separator after each text that ends a document.
    The engine sees the batch in slices of about `SLICE_CHARS`, each turned into ids at once:
    its Encoding objects (ids, offsets, token strings for every token) cost some 100 bytes a
    token, so a whole batch's would hold tens of MB per worker."""
    from llmlab.data.tokenizer import engine_errors

    tok, eos, dtype = _state["tok"], _state["eos_id"], _state["dtype"]
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # _fast: no offsets (tokenizers >= 0.20)
    parts, start = [], 0
    while start < len(texts):
        stop, chars = start, 0
        while stop < len(texts) and (chars < SLICE_CHARS or stop == start):
            chars += len(texts[stop])
            stop += 1
        with engine_errors():
            encoded = encode(texts[start:stop], add_special_tokens=False)
        out: list[int] = []
        for e, end in zip(encoded, ends[start:stop]):
            out.extend(e.ids)
            if end and eos is not None:
                out.append(eos)
        del encoded
        parts.append(np.asarray(out, dtype=dtype))
        start = stop
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


@contextlib.contextmanager
def _in_process(tokenizer: Any, eos_id: int | None, dtype: str, one_thread: bool):
    saved, before = os.environ.get("TOKENIZERS_PARALLELISM"), dict(_state)
    try:
        _start(tokenizer, eos_id, dtype, one_thread)
        yield
    finally:
        _state.clear()
        _state.update(before)
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def encode_batches(batches: Iterable[Any], tokenizer: Any, eos_id: int | None, dtype: np.dtype,
                   workers: int) -> Iterator[tuple[Any, np.ndarray]]:
    """(batch, ids) for each batch, in order. A batch has ``texts`` and ``ends``; ``workers``
    processes encode them (1: this process on one thread; 0: this process, with the engine's
    own threads, for inputs too small to repay starting workers). ``tokenizer``: a
    `tokenizers.Tokenizer`."""
    if workers <= 1:
        with _in_process(tokenizer, eos_id, np.dtype(dtype).name, one_thread=workers == 1):
            for batch in batches:
                yield batch, encode_texts(batch.texts, batch.ends)
        return
    import multiprocessing

    # spawn: a fresh interpreter per worker (no fork of a process that holds threads or torch)
    args = (tokenizer.to_str(), eos_id, np.dtype(dtype).name)
    with multiprocessing.get_context("spawn").Pool(workers, initializer=_start, initargs=args) as pool:
        pending: deque = deque()
        for batch in batches:
            pending.append((batch, pool.apply_async(encode_texts, (batch.texts, batch.ends))))
            if len(pending) >= 2 * workers:
                done, result = pending.popleft()
                yield done, result.get()
        while pending:
            done, result = pending.popleft()
            yield done, result.get()
