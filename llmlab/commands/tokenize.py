"""llmlab tokenize: corpus -> trained tokenizer -> token shards in the cache."""

import json
from pathlib import Path

from llmlab.errors import ConfigError


def validate(cfg: dict) -> None:
    from llmlab.data.corpus import CORPUS
    from llmlab.data.tokenizer import TOKENIZER
    for key in cfg:
        if key not in ("data", "tokenizer", "cache_dir"):
            raise ConfigError(f"{key}: unknown key; allowed: cache_dir, data, tokenizer")
    CORPUS.config(cfg.get("data"), "data")
    TOKENIZER.config(cfg.get("tokenizer"), "tokenizer")


def run(cfg: dict, run_dir: Path) -> None:
    from llmlab import console
    from llmlab.data.prepare import prepare, print_summary

    prepared = prepare(cfg["data"], cfg["tokenizer"], cfg.get("cache_dir"), quiet=False)
    if not prepared.built:
        print_summary(prepared, cached=True)
    (run_dir / "tokenize.json").write_text(json.dumps({"path": str(prepared.path), **prepared.meta}, indent=2))
    console.out.print(f"shards: {prepared.path}")
