"""llmlab tokenize: corpus -> trained tokenizer -> token shards in the cache."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmlab.commands import Command
from llmlab.data.corpus import CORPUS
from llmlab.data.tokenizer import TOKENIZER
from llmlab.registry import section


@dataclass
class TokenizeConfig:
    """``llmlab tokenize``'s settings; ``data`` and ``tokenizer`` come from their config groups."""

    cache_dir: str | None = None  # null: $LLMLAB_CACHE or .cache/llmlab
    data: Any = section()
    tokenizer: Any = section()


def run(job: TokenizeConfig, run_dir: Path) -> None:
    from llmlab import console
    from llmlab.data.prepare import prepare, print_summary

    prepared = prepare(job.data, job.tokenizer, job.cache_dir, quiet=False)
    if not prepared.built:
        print_summary(prepared, cached=True)
    (run_dir / "tokenize.json").write_text(json.dumps({"path": str(prepared.path), **prepared.meta}, indent=2))
    console.out.print(f"shards: {prepared.path}")


COMMAND = Command("tokenize", TokenizeConfig, run, sections={"data": CORPUS, "tokenizer": TOKENIZER})
SCHEMA = COMMAND.schema
