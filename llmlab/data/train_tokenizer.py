"""Training the tokenizer on a fixed sample of the train split.

For a corpus that is not small the trainer runs in a child process: BPE's tables of words and
pairs grow with the sample (0.27 GB for a 110 MB sample of code, 0.34 GB for 254 MB), and
memory a process frees is seldom given back to the system, so a parent that trained would keep that peak through the
whole encoding. The child ends, and its memory goes with it. The parent only shows progress.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Iterator

from llmlab.data.corpus import Corpus
from llmlab.data.documents import hash_fraction, pieces
from llmlab.data.tokenizer import EOS, TextTokenizer
from llmlab.errors import UserError

_progress: Any = None  # in the child: a shared count of the sample's bytes read so far


def segments(text: str, separator: str | None) -> list[str]:
    """A document's texts between literal separators: corpora such as TinyStories mark their
    document boundaries with ``<|endoftext|>`` in the text itself. Each segment is encoded as
    a document of its own (the separator id follows it), and the literal is never text that
    tokenizer training learns merges from (``<|``, ``endoft``: merges that could never fire,
    since encoding maps the literal to its id)."""
    if not separator or separator not in text:
        return [text]
    return [part for part in text.split(separator) if part]


def sample_for_tokenizer(corpus: Corpus, budget: int | None) -> tuple[Iterator[list[str]], dict[str, int]]:
    """Texts for tokenizer training, in lists: the train split, or with a ``budget`` in bytes a
    fixed sample of it: each document (or part of one) is taken when a hash of its name falls
    below budget / size, until the budget is spent. Literal separators never reach training.
    ``used`` fills in as the texts are read."""
    size = corpus.size("train")
    share = 1.0 if budget is None or not size else min(1.0, budget / size)
    used = {"bytes": 0, "of": size or 0, "read": 0}

    def texts() -> Iterator[list[str]]:
        part_of: dict[str, int] = {}
        out: list[str] = []
        for doc in corpus.stream("train"):
            used["read"] += doc.nbytes
            k = part_of.pop(doc.name, 0)  # which part of its document this is (held until its end)
            if not doc.end:
                part_of[doc.name] = k + 1
            if share < 1 and hash_fraction(f"tokenizer:{doc.name}#{k}") >= share:
                continue
            out += [p for seg in segments(doc.text, EOS) for p in pieces(seg)]
            used["bytes"] += doc.nbytes
            if len(out) >= 256:
                yield out
                out = []
            if budget is not None and used["bytes"] >= budget:
                break
        if out:
            yield out
    return texts(), used


def _train(corpus: Corpus, factory, report=None) -> tuple[TextTokenizer, dict[str, int]]:
    texts, used = sample_for_tokenizer(corpus, factory.train_bytes())

    def counted() -> Iterator[list[str]]:
        for chunk in texts:
            yield chunk
            if report is not None:
                report(used["bytes"])
    return factory.make(counted), used


def _remember(progress) -> None:
    global _progress
    _progress = progress


def _train_in_child(corpus: Corpus, factory) -> tuple[str, str | None, dict[str, int]]:
    def report(nbytes: int) -> None:
        _progress.value = nbytes
    tok, used = _train(corpus, factory, report)
    return tok.tok.to_str(), tok.eos, used


def train_tokenizer(corpus: Corpus, factory, stage, in_child: bool) -> tuple[TextTokenizer, dict[str, int]]:
    """The tokenizer ``factory`` makes from a sample of ``corpus`` (``tokenizer.train_bytes``),
    and what the sample used; ``stage.update(nbytes)`` follows the bytes read. ``in_child``:
    train in a spawned process (a fresh interpreter: nothing of this one's threads or memory)."""
    if not in_child:
        seen = [0]

        def here(nbytes: int) -> None:
            stage.update(nbytes - seen[0])
            seen[0] = nbytes
        return _train(corpus, factory, here)
    from tokenizers import Tokenizer

    ctx = multiprocessing.get_context("spawn")
    progress = ctx.Value("q", 0, lock=False)
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=_remember, initargs=(progress,)) as pool:
        future, seen = pool.submit(_train_in_child, corpus, factory), 0
        while not future.done():
            wait([future], timeout=0.5)
            stage.update(progress.value - seen)
            seen = progress.value
        try:
            text, eos, used = future.result()
        except BrokenProcessPool:
            raise UserError("tokenizer: the process training it ended abruptly (out of memory?); a smaller "
                            "tokenizer.train_bytes bounds its memory") from None
    return TextTokenizer(Tokenizer.from_str(text), eos), used
