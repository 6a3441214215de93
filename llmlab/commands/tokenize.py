"""llmlab tokenize: corpus -> trained tokenizer -> token shards in the cache."""

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmlab.commands import Command
from llmlab.data.corpus import CORPUS
from llmlab.data.tokenizer import TOKENIZER
from llmlab.files import atomic_write_text
from llmlab.registry import section


@dataclass
class TokenizeConfig:
    """``llmlab tokenize``'s settings; ``data`` and ``tokenizer`` come from their config groups."""

    cache_dir: str | None = None  # null: $LLMLAB_CACHE or .cache/llmlab
    data: Any = section()
    tokenizer: Any = section()


def run(job: TokenizeConfig, run_dir: Path) -> None:
    from llmlab import console
    from llmlab.data.prepare import prepare, print_summary, verify_shards

    prepared = prepare(job.data, job.tokenizer, job.cache_dir, quiet=False)
    if not prepared.built:
        print_summary(prepared, cached=True)
        t = time.perf_counter()
        done = verify_shards(prepared)
        old = (f"; {done['unrecorded']} from before checksums were recorded, not checked"
               if done["unrecorded"] else "")
        console.out.print(f"checksums: {done['checked']} shard{'s' if done['checked'] != 1 else ''} read back and "
                          f"matching meta.json ({done['bytes'] / 1e6:,.1f} MB in {time.perf_counter() - t:.2f}s){old}")
    atomic_write_text(run_dir / "tokenize.json", json.dumps({"path": str(prepared.path), **prepared.meta}, indent=2))
    console.out.print(f"shards: {prepared.path}")


COMMAND = Command("tokenize", TokenizeConfig, run, sections={"data": CORPUS, "tokenizer": TOKENIZER})
SCHEMA = COMMAND.schema
