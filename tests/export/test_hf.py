"""Export to transformers: the exported directory loads offline, and its loss on the same
tokens equals llmlab's within 1e-4; variants transformers cannot represent are refused."""

import contextlib

import numpy as np
import pytest
import torch

from llmlab.errors import UserError
from llmlab.eval.loss import evaluate_loss
from llmlab.export.hf import export_hf
from llmlab.train.checkpoint import build_model
from tests.helpers import EXPORT_CASES as CASES
from tests.helpers import export_checkpoint as checkpoint
from tests.helpers import hf_loss


@pytest.mark.parametrize("case", CASES)
def test_exported_model_scores_like_llmlab(tmp_path, case):
    import transformers

    overrides, arch = CASES[case]
    ckpt = checkpoint(tmp_path, *overrides)
    model = build_model(ckpt, torch.device("cpu"))
    res = export_hf(ckpt, model, tmp_path / "hf")
    assert res["architecture"] == arch
    tokens = np.random.default_rng(0).integers(0, 257, 32 * 4 + 1)
    ours = evaluate_loss(model, tokens, 32, 4, torch.device("cpu"), contextlib.nullcontext())["loss"]
    assert abs(hf_loss(tmp_path / "hf", tokens, 32) - ours) < 1e-4
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "def f(x):\n    return 'ü'\n"
    assert tok.encode(text, add_special_tokens=False) == ckpt.tokenizer().encode(text)
    assert tok.eos_token == "<|endoftext|>"


REFUSED = {
    "post-norm": (["model=llama", "norm=post"], "norm.placement=post"),
    "mla": (["model=mla"], "MLA"),
    "dsa": (["model=llama", "model/attention=dsa", "attention.base=gqa", "attention.topk=8"], "attention=dsa"),
    "short window": (["model=llama", "model/attention=swa", "attention.window=8"], "sliding window of 8"),
    "moe": (["model=llama", "model/ffn=moe"], "mixture of experts"),
    "mlm": (["model=bert"], "objective=mlm"),
    "sinusoidal": (["model=llama", "pos=sinusoidal"], "pos=sinusoidal"),
    "mup": (["model=llama", "model.parametrization=mup", "model.mup_base_width=16"], "model.parametrization=mup"),
    "qknorm, its own eps": (["model=qknorm", "attention.eps=1e-6"], "the q/k norms' eps 1e-06 != norm.eps=1e-05"),
    "qknorm, biases": (["model=qknorm", "model.bias=true"], "model.bias=true (Qwen3's MLP has no biases)"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_unrepresentable_variants_are_refused_with_the_reason(tmp_path, case):
    overrides, reason = REFUSED[case]
    ckpt = checkpoint(tmp_path, *overrides)
    with pytest.raises(UserError) as e:
        export_hf(ckpt, build_model(ckpt, torch.device("cpu")), tmp_path / "hf")
    message = str(e.value)
    assert reason in message and "\n" not in message and message.startswith("export:")
    assert not (tmp_path / "hf").exists()  # nothing half-written
