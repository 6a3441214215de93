"""llmlab tokenize: corpus -> trained tokenizer -> token shards in the cache."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llmlab.data.corpus  # noqa: F401  (registers the data group's options)
import llmlab.data.tokenizer  # noqa: F401  (and the tokenizer group's)
from llmlab.registry import parse_dataclass, section, settings_lines, store_schema


@dataclass
class TokenizeConfig:
    """``llmlab tokenize``'s settings; ``data`` and ``tokenizer`` come from their config groups."""

    cache_dir: str | None = None  # null: $LLMLAB_CACHE or .cache/llmlab
    data: Any = section()
    tokenizer: Any = section()

    def check(self, prefix: str) -> None:
        from llmlab.data.corpus import CORPUS
        from llmlab.data.tokenizer import TOKENIZER
        CORPUS.config(self.data, "data")
        TOKENIZER.config(self.tokenizer, "tokenizer")


SCHEMA = store_schema("tokenize", TokenizeConfig)


def validate(cfg: dict) -> None:
    parse_dataclass(SCHEMA, cfg, "")


def help_settings() -> list[str]:
    return settings_lines(SCHEMA)


def run(cfg: dict, run_dir: Path) -> None:
    from llmlab import console
    from llmlab.data.prepare import prepare, print_summary

    prepared = prepare(cfg["data"], cfg["tokenizer"], cfg.get("cache_dir"), quiet=False)
    if not prepared.built:
        print_summary(prepared, cached=True)
    (run_dir / "tokenize.json").write_text(json.dumps({"path": str(prepared.path), **prepared.meta}, indent=2))
    console.out.print(f"shards: {prepared.path}")
