"""muP (``model.parametrization=mup``): the coordinate check of Yang et al. 2022 (activation
sizes stay flat across widths over the first steps of Adam, where under the standard
parametrization they grow with the width), and muP at its base width is the standard model."""

from __future__ import annotations

import pytest
import torch

from llmlab.model.config import ModelSpec
from llmlab.model.transformer import Transformer
from llmlab.train.optim import build_optimizer
from llmlab.train.optim import AdamW

WIDTHS = (32, 64, 128, 256)
STEPS = 5


def spec(width: int, parametrization: str, base: int = 32) -> ModelSpec:
    return ModelSpec.from_config({
        "model": {"d_model": width, "n_layers": 2, "n_heads": 4, "max_seq_len": 64, "parametrization": parametrization,
                  "mup_base_width": base, "tie_embeddings": False},
        "attention": {"kind": "mha"}, "ffn": {"kind": "gelu"}, "norm": {"placement": "pre"}, "pos": {"kind": "rope"}},
        vocab_size=256)


def coordinates(width: int, parametrization: str, lr: float = 1e-2) -> list[dict[str, float]]:
    """Mean |x| of each sublayer's output, each block's output and the logits, at each of the
    first `STEPS` steps of AdamW on one fixed batch."""
    torch.manual_seed(0)
    model = Transformer(spec(width, parametrization))
    seen: dict[str, float] = {}
    for i, block in enumerate(model.blocks):
        block.attn.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"attn{i}", out[0].abs().mean().item()))
        block.ffn.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"ffn{i}", out.abs().mean().item()))
        block.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"block{i}", out[0].abs().mean().item()))
    opt = build_optimizer(AdamW.Config(lr=lr, weight_decay=0.0), model, torch.device("cpu"))
    batch = torch.randint(0, 256, (8, 65), generator=torch.Generator().manual_seed(1))
    out = []
    for _ in range(STEPS):
        res = model(batch[:, :-1], batch[:, 1:])
        out.append({**seen, "logits": res.logits.abs().mean().item()})
        opt.zero_grad()
        res.loss.backward()
        opt.step()
    return out


def spread_over_widths(parametrization: str) -> list[dict[str, float]]:
    """Per step and activation: the largest size over the widths divided by the smallest."""
    runs = {w: coordinates(w, parametrization) for w in WIDTHS}
    return [{k: max(runs[w][t][k] for w in WIDTHS) / min(runs[w][t][k] for w in WIDTHS) for k in runs[WIDTHS[0]][t]}
            for t in range(STEPS)]


def test_coordinate_check_mup_keeps_activations_flat_across_widths_where_standard_grows():
    mup, standard = spread_over_widths("mup"), spread_over_widths("standard")
    # an 8x wider model: under muP every activation stays within a factor 3 at every step (the
    # logits start at 1/sqrt(width) and become width-independent as training moves them),
    # where the standard parametrization's grow 35 to 160x over the same steps
    worst = max(v for step in mup[1:] for v in step.values())
    assert worst < 3, mup
    assert max(mup[0][k] for k in mup[0] if k != "logits") < 1.2  # at init, the hidden ones are flat
    # under the standard parametrization the same steps blow up with the width
    assert min(standard[-1][k] for k in standard[-1] if k.startswith("block")) > 8, standard
    assert standard[-1]["logits"] > 2 * mup[-1]["logits"]


def test_mup_at_its_base_width_is_the_standard_model():
    torch.manual_seed(0)
    plain = Transformer(spec(64, "standard"))
    torch.manual_seed(0)
    mup = Transformer(spec(64, "mup", base=64))
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), mup.state_dict().values()))
    x = torch.randint(0, 256, (2, 16))
    assert torch.equal(plain(x).logits, mup(x).logits)
    assert mup.lr_multipliers() == {}


def test_mup_scales_the_learning_rate_and_init_of_hidden_matrices_only():
    model = Transformer(spec(128, "mup", base=32))  # width_mult 4
    opt = build_optimizer(AdamW.Config(lr=1e-2, weight_decay=0.1), model, torch.device("cpu"))
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    hidden = model.hidden_matrices()
    assert hidden and all(lr_of[id(p)] == pytest.approx(1e-2 / 4) for p in hidden)
    others = [p for p in model.parameters() if id(p) not in {id(h) for h in hidden}]
    assert model.embed.weight in others and all(lr_of[id(p)] == pytest.approx(1e-2) for p in others)
    assert id(model.lm_head.weight) in {id(p) for p in others}  # the readout: a constant rate, its logits scaled instead
    q = model.blocks[0].attn.qkv_proj.weight
    assert q.std().item() == pytest.approx(0.02 / 2, rel=0.05)  # init_std / sqrt(width_mult)
    assert model.embed.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[0].attn.score_mult == pytest.approx(0.5) and model.output_mult == pytest.approx(0.25)


def test_mup_with_a_tied_head_names_the_setting():
    from llmlab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^model.tie_embeddings: model.parametrization=mup needs an untied LM head"):
        ModelSpec.from_config({"model": {"parametrization": "mup"}, "attention": {"kind": "mha"}}, vocab_size=256)
