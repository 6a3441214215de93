"""``data.doc_mask``: attention never crosses a document boundary inside a window."""

from __future__ import annotations

import json

import pytest
import torch

from llmlab.model.attention import ATTENTION
from llmlab.model.transformer import documents
from tests.conftest import tiny_model

EOS = 0
ATTN = {"gqa": {"kind": "gqa", "kv_heads": 2}, "swa": {"kind": "swa", "window": 5}}


def test_each_position_belongs_to_the_document_its_end_token_closes():
    idx = torch.tensor([[5, 6, EOS, 7, 8, EOS, EOS, 9]])
    assert documents(idx, EOS).tolist() == [[0, 0, 0, 1, 1, 1, 2, 3]]


@pytest.mark.parametrize("attn", ATTENTION.names())
def test_a_document_is_scored_as_if_it_were_alone(attn):
    """With the mask, the positions of the second document of a window get the logits that
    document gets when it starts its own window at position 0 only where positions play no
    part; with any position scheme, changing the first document changes nothing after it."""
    model = tiny_model(attention=ATTN.get(attn, {"kind": attn}))
    model.doc_eos = EOS
    first, second = torch.randint(1, 97, (1, 9)), torch.randint(1, 97, (1, 12))
    other = torch.randint(1, 97, (1, 9))
    x = torch.cat([first, torch.tensor([[EOS]]), second], dim=1)
    y = torch.cat([other, torch.tensor([[EOS]]), second], dim=1)
    with torch.no_grad():
        a, b = model(x).logits, model(y).logits
        assert torch.allclose(a[:, 10:], b[:, 10:], atol=1e-5)  # nothing of the first document reaches the second
        assert not torch.allclose(a[:, :10], b[:, :10])
        model.doc_eos = None
        c, d = model(x).logits, model(y).logits
    assert not torch.allclose(c[:, 10:], d[:, 10:], atol=1e-5)  # without the mask it does


@pytest.mark.parametrize("attn", ["gqa", "swa"])  # shared key/value heads; one per query head, with a window
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")  # unfused on purpose
def test_flex_attention_keeps_the_same_documents_as_the_mask(attn, monkeypatch):
    """The CUDA route (`llmlab.model.flex`), run unfused on the CPU: the same logits as SDPA
    under the boolean mask, at several documents a window (its CPU path has no backward)."""
    from llmlab.model import flex

    if flex.flex_attention is None:
        pytest.skip("this PyTorch has no flex attention")
    model = tiny_model(attention=ATTN.get(attn, {"kind": attn}))
    model.doc_eos = EOS
    x = torch.randint(1, 97, (2, 33))
    x[0, [5, 17]] = EOS
    x[1, 29] = EOS
    logits = []
    for force in (False, True):
        monkeypatch.setattr(flex, "FORCE", force)
        with torch.no_grad():
            logits.append(model(x[:, :-1]).logits)
    assert torch.allclose(logits[0], logits[1], atol=1e-5)
    monkeypatch.setattr(flex, "FORCE", False)
    model.doc_eos = None
    with torch.no_grad():  # the documents matter here: unmasked, the logits differ
        assert not torch.allclose(model(x[:, :-1]).logits, logits[0], atol=1e-5)


def test_the_mask_trains_and_recomputes_the_same(tmp_path):
    model = tiny_model()
    model.doc_eos, model.checkpointing = EOS, "full"
    x = torch.randint(0, 97, (2, 25))
    x[:, 7] = EOS
    loss = model(x[:, :-1], x[:, 1:]).loss
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    model.checkpointing = "none"
    again = model(x[:, :-1], x[:, 1:]).loss
    again.backward()
    assert again.item() == loss.item()
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, [p for p in model.parameters() if p.grad is not None]))


def test_a_run_with_the_mask_trains_scores_and_keeps_its_cache_entry(corpus_dir, tmp_path):
    from llmlab.train.loop import run_training
    from tests.helpers import config

    runs, base = {}, config(corpus_dir, tmp_path, steps=6, eval_every=6)
    # the sample files as documents of their own, many to a window of 32 bytes
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, line in enumerate(line for f in sorted(corpus_dir.iterdir()) for line in f.read_text().splitlines() if line):
        (docs / f"{i:04d}.txt").write_text(line + "\n")
    base["data"] = {**base["data"], "paths": [str(docs / "*.txt")]}
    for mask in (False, True):
        cfg = {**base, "data": {**base["data"], "doc_mask": mask}}
        runs[mask] = run_training(cfg, tmp_path / f"run-{mask}")
    assert runs[True]["run_id"] != runs[False]["run_id"]
    assert len(list((tmp_path / "cache").iterdir())) == 1  # one prepared entry: the mask is no part of the data
    assert runs[True]["val_loss"] != runs[False]["val_loss"]
    saved = json.loads((tmp_path / "run-True" / "summary.json").read_text())
    assert saved["val_loss"] == runs[True]["val_loss"]
    from llmlab.train.checkpoint import build_model, load_checkpoint

    masked = build_model(load_checkpoint(tmp_path / "run-True"), torch.device("cpu"))
    plain = build_model(load_checkpoint(tmp_path / "run-False"), torch.device("cpu"))
    assert masked.doc_eos == 256 and plain.doc_eos is None  # eval and sample score as the run trained


def test_sparse_attention_chooses_its_keys_inside_the_document():
    model = tiny_model(attention={"kind": "dsa", "topk": 2, "dense_warmup": 0})
    model.doc_eos = EOS
    for block in model.blocks:
        block.attn.at_step(10)  # past the dense warm-up: top-2 keys a query
    first, other, second = torch.randint(1, 97, (1, 9)), torch.randint(1, 97, (1, 9)), torch.randint(1, 97, (1, 12))
    x = torch.cat([first, torch.tensor([[EOS]]), second], dim=1)
    y = torch.cat([other, torch.tensor([[EOS]]), second], dim=1)
    with torch.no_grad():
        a, b = model(x).logits, model(y).logits
    assert torch.isfinite(a).all() and torch.allclose(a[:, 10:], b[:, 10:], atol=1e-5)
