import pytest
import torch

from llmlab.train.optim import OPTIMIZER, build_optimizer, param_groups
from llmlab.train.schedule import SCHEDULE
from tests.conftest import tiny_model


def test_cosine_warms_up_then_decays_to_the_floor():
    s = SCHEDULE.build(SCHEDULE.config({"kind": "cosine", "warmup": 10, "min_lr_ratio": 0.1}, "sched"), 110)
    assert s(0) == pytest.approx(0.1)
    assert s(9) == pytest.approx(1.0)
    assert s(10) == pytest.approx(1.0)
    assert s(60) == pytest.approx(0.55)  # half-way: (1 + 0.1) / 2
    assert s(109) == pytest.approx(0.1, abs=1e-3)
    values = [s(i) for i in range(10, 110)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_constant_after_warmup():
    s = SCHEDULE.build(SCHEDULE.config({"kind": "constant", "warmup": 4}, "sched"), 100)
    assert [s(i) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_no_decay_on_norms_biases_and_embeddings():
    model = tiny_model(bias=True)
    decay, no_decay = param_groups(model, 0.1)
    decayed = {id(p) for p in decay["params"]}
    for name, p in model.named_parameters():
        expected = p.dim() >= 2 and "embed" not in name
        assert (id(p) in decayed) == expected, name
    total = len(decay["params"]) + len(no_decay["params"])
    assert total == len(list(model.parameters()))  # the tied head is counted once


def test_adamw_builds_with_the_settings():
    cfg = OPTIMIZER.config({"kind": "adamw", "lr": 1e-3, "beta2": 0.99}, "optim")
    opt = build_optimizer(cfg, tiny_model(), torch.device("cpu"))
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.param_groups[0]["betas"] == (0.9, 0.99) and opt.param_groups[0]["weight_decay"] == 0.1
