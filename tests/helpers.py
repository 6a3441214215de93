"""What several test modules share: a tiny run's settings, the composed config of a command
line, reading a run's losses, and the checks of a one-line error. Imported, never collected."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tests.conftest import run_cli, the_error_line

# `llmlab train` overrides for a tiny model on a byte tokenizer, with frequent logs
TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=32", "tokenizer=byte",
        "logger=none", "train.batch_size=2", "train.log_every=1", "train.eval_windows=2", "train.sample_tokens=4",
        "train.prompts=[x]"]


def config(corpus_dir: Path, tmp_path: Path, **train) -> dict:
    """A composed train config for `run_training` on the corpus of ``corpus_dir``, with
    ``train.*`` settings from ``train``."""
    # one file of all the sample texts, split at its tail: train and val share a distribution
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("".join(p.read_text() for p in sorted(corpus_dir.iterdir())) * 3)
    return {
        "seed": 0, "device": "cpu", "precision": "auto", "cache_dir": str(tmp_path / "cache"),
        "data": {"kind": "text", "paths": [str(mixed)], "val_fraction": 0.25},
        "tokenizer": {"kind": "byte"},
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 32},
        "attention": {"kind": "mha"}, "norm": {"placement": "pre", "kind": "rmsnorm"}, "pos": {"kind": "rope"},
        "optim": {"kind": "adamw", "lr": 3e-3}, "sched": {"kind": "cosine", "warmup": 5},
        "logger": {"kind": "none"},
        "train": {"steps": 60, "batch_size": 8, "log_every": 5, "eval_every": 30, "eval_windows": 8,
                  "ckpt_every": 0, "sample_tokens": 4, "prompts": ["x"], **train},
    }


def composed(*overrides: str, command: str = "train") -> dict:
    """``command``'s config for ``overrides``, composed and resolved as the CLI composes it."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from llmlab.cli import register_parts
    from llmlab.paths import conf_dir

    register_parts()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return OmegaConf.to_container(compose(command, overrides=list(overrides)), resolve=True)


def job_of(*overrides: str):
    """The `TrainJob` of ``llmlab train <overrides>``, and the composed config it came from."""
    from llmlab.train.settings import check_train_config

    cfg = composed(*overrides)
    return check_train_config(cfg), cfg


def losses(run: Path) -> dict[int, float]:
    """A run's logged train losses by step."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def one_line_error(result, code: int, *fragments: str) -> str:
    """The command's one error line, after checking its exit status, that no traceback was
    printed and that the line holds each of ``fragments``."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    line = the_error_line(result.stderr)
    assert line is not None, result.stderr.strip()  # progress bars may come before it; one error line, the last
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


def train_a_tiny_run(tmp_path_factory, process: bool):
    """tokenize, then train a tiny model for a few steps, as a user would: in fresh processes
    (``process``), or in this one (the same code, without two interpreters' start-up)."""
    from tests.conftest import write_corpus
    root = tmp_path_factory.mktemp("e2e")
    corpus = write_corpus(root, repeat=3)
    data = ["data=text", f"data.paths=[{corpus}/*]"]
    tok = run_cli("tokenize", *data, "tokenizer=byte", process=process, cwd=root)
    assert tok.returncode == 0, tok.stderr
    assert "bytes/token" in tok.stdout
    train = run_cli("train", *data, *TINY, "train.steps=6", "train.eval_every=3", "train.ckpt_every=3",
                    "hydra.run.dir=outputs/run", process=process, cwd=root)
    assert train.returncode == 0, train.stderr
    return root, train


def incremental_logits(model, x, cuts):
    """Feed x through the cache in the chunks that ``cuts`` mark."""
    cache = model.new_cache(x.shape[0])
    bounds = [0, *cuts, x.shape[1]]
    return torch.cat([model(x[:, a:b], cache=cache).logits for a, b in zip(bounds, bounds[1:])], dim=1)


def hf_loss(directory, tokens: np.ndarray, block: int) -> float:
    """Mean next-token loss of the transformers model over the same fixed windows."""
    import transformers  # a test dependency (pip install -e ".[test]"), loaded where used, not at collection

    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    n = (len(tokens) - 1) // block
    windows = torch.from_numpy(np.stack([tokens[i * block:i * block + block + 1] for i in range(n)])).long()
    with torch.no_grad():
        logits = model(windows[:, :-1]).logits
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), windows[:, 1:].reshape(-1)))


def export_checkpoint(tmp_path, *overrides):
    """A checkpoint of a small model with non-trivial norms and biases, and a byte tokenizer."""
    from llmlab.data.tokenizer import TOKENIZER
    from llmlab.model.transformer import ModelSpec, Transformer
    from llmlab.train.checkpoint import load_checkpoint, save_checkpoint

    tok = TOKENIZER.build(TOKENIZER.config({"kind": "byte"}, "tokenizer")).make()
    tok.save(tmp_path / "tokenizer.json")
    cfg = composed(*overrides, "model.d_model=64", "model.n_layers=2", "model.n_heads=4", "model.max_seq_len=32")
    spec = ModelSpec.from_config(cfg, vocab_size=tok.vocab_size)
    torch.manual_seed(0)
    model = Transformer(spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    path = save_checkpoint(tmp_path / "ckpts", 1, model, spec.to_dict(), cfg, tmp_path / "tokenizer.json",
                           {"eos": tok.eos})
    return load_checkpoint(path)


# model settings `llmlab export` writes, each with the transformers class it becomes
EXPORT_CASES = {
    "llama tied": (["model=llama", "model.tie_embeddings=true"], "LlamaForCausalLM"),
    "llama untied, biases": (["model=llama", "model.tie_embeddings=false", "model.bias=true"], "LlamaForCausalLM"),
    "gqa": (["model=llama", "model/attention=gqa", "attention.kv_heads=2"], "LlamaForCausalLM"),
    "mqa": (["model=llama", "model/attention=mqa"], "LlamaForCausalLM"),
    "swa window = context": (["model=llama", "model/attention=swa", "attention.window=32"], "LlamaForCausalLM"),
    "tiny with MTP heads": (["model=tiny", "model/attention=mha", "model.mtp_heads=2"], "LlamaForCausalLM"),
    # the default model: q/k norms per head before RoPE, as Qwen3 has them
    "tiny (qknorm)": (["model=tiny"], "Qwen3ForCausalLM"),
    "qknorm one kv head per query head, untied": (["model=qknorm", "attention.kv_heads=4", "model.tie_embeddings=false"],
                                                  "Qwen3ForCausalLM"),
    "qknorm, another eps for every norm": (["model=qknorm", "norm.eps=1e-3"], "Qwen3ForCausalLM"),
    "gpt2": (["model=gpt2"], "GPT2LMHeadModel"),
    "gpt2 tanh gelu, untied": (["model=gpt2", "model/ffn=gelu_tanh", "model.tie_embeddings=false"], "GPT2LMHeadModel"),
    "gpt2 without biases": (["model=gpt2", "model.bias=false"], "GPT2LMHeadModel"),
}
