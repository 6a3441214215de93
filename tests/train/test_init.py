"""``llmlab train init=<source>``: a run started from an llmlab checkpoint or from its
transformers export takes the source's network, tokenizer and weights, so its first batch
scores exactly what the source scores there; a setting that contradicts the source is one
line naming both values."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from llmlab.data.batches import RandomWindows
from llmlab.data.prepare import prepare
from llmlab.train.checkpoint import build_model, load_checkpoint
from tests.conftest import run_cli, write_corpus
from tests.helpers import TINY, job_of, losses, one_line_error

FROM = [o for o in TINY if not o.startswith("tokenizer=")]  # TINY for a run whose source brings its tokenizer


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A tiny trained run (the default qknorm model: a Qwen3 export) and its export."""
    root = tmp_path_factory.mktemp("init")
    corpus = write_corpus(root, repeat=3)
    data = ["data=text", f"data.paths=[{corpus}/*]"]
    run = run_cli("train", *data, *TINY, "train.steps=40", "train.eval_every=0", "hydra.run.dir=src", cwd=root)
    assert run.returncode == 0, run.stderr
    export = run_cli("export", "ckpt=src", "out=hf", cwd=root)
    assert export.returncode == 0, export.stderr
    return root, data


def first_batch_loss(root: Path, data: list[str], model_from: Path) -> float:
    """The loss ``model_from``'s weights give the first batch a seed-1337 run of TINY draws."""
    job, _ = job_of(*data, *FROM, f"init={root / 'hf'}", f"cache_dir={root / '.cache'}")
    tokens = prepare(job.data, job.tokenizer, str(root / ".cache"), quiet=True).tokens("train")
    window = RandomWindows(tokens, job.spec.model.max_seq_len, job.loop.batch_size, job.seed).next_window()
    model = build_model(load_checkpoint(model_from), torch.device("cpu"))
    with torch.no_grad():
        logits = model(window[:, :-1]).logits
    return float(F.cross_entropy(logits.flatten(0, 1).float(), window[:, 1:].flatten()))


@pytest.mark.parametrize("init", ["src", "hf"])
def test_a_run_from_a_checkpoint_or_its_export_starts_at_the_sources_loss(source, init):
    root, data = source
    run = run_cli("train", *data, *FROM, f"init={init}", "train.steps=2", "train.eval_every=0",
                  f"hydra.run.dir=from-{init}", cwd=root)
    assert run.returncode == 0, run.stderr
    assert "init: the weights of" in run.stdout
    first = losses(root / f"from-{init}")[1]
    assert abs(first - first_batch_loss(root, data, root / "src")) < 1e-4
    # the source had learnt something, and the run kept it: a fresh model starts near ln(vocab)
    assert first < math.log(load_checkpoint(root / "hf").spec["vocab_size"]) - 1.0
    spec = load_checkpoint(root / f"from-{init}").spec
    assert spec["attention"]["kind"] == "qknorm" and spec["model"]["d_model"] == 32


@pytest.mark.parametrize("override, fragments", [
    ("model.d_model=64", ["model.d_model: init=", "model.d_model is 32 there (its config.json), not 64"]),
    ("model/attention=gqa", ["model/attention: init=", "attention.kind is 'qknorm' there"]),
    ("tokenizer=bpe", ["tokenizer: init=", "tokenizer.kind is 'pretrained' there (its tokenizer.json)"]),
    ("model.name=mine", ["model.name: init=", "model.name is 'hf' there (its config.json), not 'mine'"]),
    ("model=gpt2", ["model: init=", "model.bias is False there (its config.json), not True"]),
])
def test_a_setting_that_contradicts_the_source_is_one_line(source, override, fragments):
    root, data = source
    result = run_cli("train", *data, *FROM, "init=hf", override, "train.steps=1", "hydra.run.dir=no", cwd=root)
    one_line_error(result, 2, *fragments)  # before any work
    assert not (root / "no").exists()


def test_init_names_what_it_cannot_start_from(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_cli("train", "init=empty", *FROM, cwd=tmp_path)
    one_line_error(result, 2, "init: ", "is neither a checkpoint, a run directory with checkpoints/, nor a transformers")
    result = run_cli("train", "init=nowhere", *FROM, cwd=tmp_path)
    one_line_error(result, 2, "init: nowhere does not exist")


def test_a_source_whose_tokenizer_outgrows_its_model_is_refused_before_any_work(source, tmp_path):
    """A tokenizer.json with more ids than the model embeds (another model's, or a hand's):
    refused while the settings are checked, before the data is tokenized or a directory made."""
    import shutil

    from tokenizers import AddedToken, Tokenizer

    root, data = source
    crafted = tmp_path / "crafted"
    shutil.copytree(root / "hf", crafted)
    tok = Tokenizer.from_file(str(crafted / "tokenizer.json"))
    embedded = load_checkpoint(crafted).spec["vocab_size"]
    tok.add_tokens([AddedToken(f"<extra_{i}>") for i in range(embedded + 5 - tok.get_vocab_size())])
    tok.save(str(crafted / "tokenizer.json"))
    result = run_cli("train", *data, *FROM, f"init={crafted}", "train.steps=1", "hydra.run.dir=grown",
                     f"cache_dir={tmp_path / 'cache'}", cwd=root)
    one_line_error(result, 2, f"init: {crafted}: its tokenizer.json has {embedded + 5:,} ids but the model embeds only "
                              f"{embedded:,}; the tokenizer belongs to another model")
    assert not (root / "grown").exists() and not (tmp_path / "cache").exists()


def test_init_stays_out_of_the_run_id_when_unset():
    plain, _ = job_of(*TINY)
    assert "init" in plain.config and plain.config["init"] is None
    from dataclasses import replace
    assert replace(plain, config={k: v for k, v in plain.config.items() if k != "init"}).run_id == plain.run_id


def test_a_config_that_its_weights_do_not_match_is_refused_before_a_model_is_built(source, tmp_path):
    import json
    import shutil

    root, data = source
    crafted = tmp_path / "crafted"
    shutil.copytree(root / "hf", crafted)
    config = json.loads((crafted / "config.json").read_text())
    config.update(hidden_size=2**20, num_hidden_layers=4096, head_dim=2**20 // config["num_attention_heads"])
    (crafted / "config.json").write_text(json.dumps(config))
    loop = [o for o in FROM if not o.startswith("model.")]
    result = run_cli("train", *data, *loop, f"init={crafted}", "train.steps=1", "hydra.run.dir=crafted", cwd=root)
    one_line_error(result, 1, "model.embed_tokens.weight is torch.float32 (320, 32), but config.json implies a float "
                              "tensor of shape (320, 1048576)")


def test_a_run_from_init_resumes_from_its_own_checkpoint_not_the_source(source):
    root, data = source
    args = ["train", *data, *FROM, "init=hf", "train.steps=4", "train.eval_every=0", "hydra.run.dir=resumed"]
    first = run_cli(*args, "train.max_steps=2", cwd=root)
    assert first.returncode == 0, first.stderr
    again = run_cli(*args, cwd=root)
    assert again.returncode == 0, again.stderr
    assert "init: the weights of" not in again.stdout  # the resume's weights, not the source's again
    whole = run_cli(*[a.replace("resumed", "whole") for a in args], cwd=root)
    assert whole.returncode == 0, whole.stderr
    assert losses(root / "resumed")[4] == losses(root / "whole")[4]  # resumed exactly
