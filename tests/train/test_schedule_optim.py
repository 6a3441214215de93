import pytest
import torch

from llmlab.errors import ConfigError
from llmlab.train.optim import OPTIMIZER, build_optimizer, param_groups
from llmlab.train.schedule import SCHEDULE
from tests.conftest import test_config, tiny_model


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


def sched(**cfg):
    return SCHEDULE.build(SCHEDULE.config(cfg, "sched"), 100)


def test_linear_decays_to_the_floor():
    s = sched(kind="linear", warmup=10, min_lr_ratio=0.2)
    assert s(9) == pytest.approx(1.0)
    assert s(10) == pytest.approx(1.0)
    assert s(55) == pytest.approx(0.6)  # half-way from 1 to 0.2
    assert s(99) == pytest.approx(0.2 + 0.8 / 90, abs=1e-9)


@pytest.mark.parametrize("cooldown, mid", [("linear", 0.5), ("cosine", 0.5)])
def test_wsd_holds_then_cools_down(cooldown, mid):
    s = sched(kind="wsd", warmup=10, decay_fraction=0.2, cooldown=cooldown, min_lr_ratio=0.0)
    assert s(0) == pytest.approx(0.1)
    assert all(s(i) == 1.0 for i in range(10, 80))  # stable until the last 20 steps
    assert s(89) == pytest.approx(mid)  # half of the cool-down done
    assert s(99) == pytest.approx(0.0, abs=1e-9)
    values = [s(i) for i in range(80, 100)]
    assert all(a > b for a, b in zip(values, values[1:]))


def test_schedule_config_errors_name_the_key():
    from llmlab.errors import ConfigError
    with pytest.raises(ConfigError, match=r"^sched.cooldown: unknown 'step'; allowed: linear, cosine$"):
        sched(kind="wsd", cooldown="step")
    with pytest.raises(ConfigError, match=r"^sched.decay_fraction: must be in \(0, 1\]"):
        sched(kind="wsd", decay_fraction=0)


@pytest.mark.parametrize("kind", OPTIMIZER.names())
def test_every_optimizer_lowers_the_loss(kind):
    torch.manual_seed(0)
    model = tiny_model().train()
    opt = build_optimizer(OPTIMIZER.config(test_config(OPTIMIZER, kind), "optim"), model, torch.device("cpu"))
    assert all("base_lr" in g for g in opt.param_groups)
    x = torch.randint(0, 97, (4, 17))
    first = None
    for _ in range(60):
        loss = model(x[:, :-1], x[:, 1:]).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first - 0.5, (kind, first, loss.item())
    state = opt.state_dict()
    opt.load_state_dict(state)  # round-trips for checkpoints


@pytest.mark.parametrize("kind", OPTIMIZER.names())
def test_an_optimizer_that_is_several_says_so(kind):
    """``several`` (fp16 loss scaling and FSDP take one torch optimizer) is declared beside the
    kind's settings, so the settings check refuses those combinations before any work."""
    opt = build_optimizer(OPTIMIZER.config(test_config(OPTIMIZER, kind), "optim"), tiny_model(), torch.device("cpu"))
    declared = getattr(OPTIMIZER.config_of(kind), "several", False)
    assert declared == (not isinstance(opt, torch.optim.Optimizer)), kind


@pytest.mark.parametrize("kind", OPTIMIZER.names())
def test_every_optimizer_refuses_a_negative_weight_decay(kind):
    with pytest.raises(ConfigError, match=r"^optim.weight_decay: must be >= 0, got -0.1$"):
        OPTIMIZER.config({"kind": kind, "weight_decay": -0.1}, "optim")


def test_lion_step_is_the_sign_of_the_interpolated_momentum():
    from llmlab.train.optim import LionOptimizer
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = LionOptimizer([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    p.grad = torch.tensor([0.3, -0.1, 0.0])
    opt.step()
    # m = 0: update = sign(0.1 * g) -> [1, -1, 0]; p <- p * (1 - lr wd) - lr * update
    assert torch.allclose(p.detach(), torch.tensor([1.0, -2.0, 3.0]) * 0.95 - 0.1 * torch.tensor([1.0, -1.0, 0.0]))
    assert torch.allclose(opt.state[p]["exp_avg"], 0.01 * torch.tensor([0.3, -0.1, 0.0]))


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    from llmlab.train.optim import Fp32Muon
    model = tiny_model()
    opt = build_optimizer(OPTIMIZER.config({"kind": "muon"}, "optim"), model, torch.device("cpu"))
    muon, adamw = opt.optimizers
    assert isinstance(muon, Fp32Muon) and isinstance(adamw, torch.optim.AdamW)  # fp32 iterations on the CPU
    muon_params = {id(p) for g in muon.param_groups for p in g["params"]}
    assert id(model.embed.weight) not in muon_params
    assert id(model.blocks[0].attn.qkv_proj.weight) in muon_params
    assert id(model.blocks[0].attn_norm.weight) not in muon_params
    n_all = len({id(p) for p in model.parameters()})
    assert len(muon_params) + sum(len(g["params"]) for g in adamw.param_groups) == n_all
    # its AdamW half runs the kernel optim=adamw runs: fused on the CPU (torch's default there
    # is a loop over the tensors)
    plain = build_optimizer(OPTIMIZER.config({"kind": "adamw"}, "optim"), model, torch.device("cpu"))
    assert adamw.defaults["fused"] is True and plain.defaults["fused"] is True


needs_muon = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")


def _muon_steps(opt, params, grads):
    for g in grads:
        for p, gp in zip(params, g):
            p.grad = gp.clone()
        opt.step()
    return [p.detach().clone() for p in params]


def _torch_muon_takes(rule) -> bool:
    try:
        torch.optim.Muon([torch.zeros(2, 2, requires_grad=True)], adjust_lr_fn=rule)
    except ValueError:  # spectral_unclamped came after torch 2.13
        return False
    return True


@needs_muon
@pytest.mark.parametrize("adjust", [None, "original", "match_rms_adamw", "spectral_unclamped"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_with_bf16_iterations_is_torchs_muon_bit_for_bit(adjust, nesterov):
    from llmlab.train.optim import Fp32Muon
    if not _torch_muon_takes(adjust):
        pytest.skip(f"this torch's Muon has no adjust_lr_fn={adjust}")
    gen = torch.Generator().manual_seed(0)
    shapes = [(24, 40), (40, 24), (16, 16)]  # wide, tall (iterated transposed), square
    start = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(3)]
    settings = dict(lr=0.05, momentum=0.9, nesterov=nesterov, weight_decay=0.1, adjust_lr_fn=adjust)
    ours = [p.clone().requires_grad_() for p in start]
    theirs = [p.clone().requires_grad_() for p in start]
    a = _muon_steps(Fp32Muon(ours, ns_dtype=torch.bfloat16, **settings), ours, grads)
    b = _muon_steps(torch.optim.Muon(theirs, **settings), theirs, grads)
    for x, y, x0 in zip(a, b, start):
        assert torch.equal(x, y) and not torch.allclose(x, x0)


@needs_muon
def test_muon_in_fp32_orthogonalises_as_float64_does_and_steps_as_torchs_rule():
    from llmlab.train.optim import Fp32Muon, orthogonalize
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(48, 20, generator=gen)
    coefficients = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's defaults
    fp32, fp64 = orthogonalize(g, coefficients, 5, 1e-7, torch.float32), orthogonalize(g, coefficients, 5, 1e-7, torch.float64)
    bf16 = orthogonalize(g, coefficients, 5, 1e-7, torch.bfloat16)
    assert fp32.dtype == torch.float32 and fp32.shape == g.shape
    assert (fp32.double() - fp64).abs().max() < 1e-5 < (bf16.double() - fp64).abs().max()
    s = torch.linalg.svdvals(fp64)  # Muon's iteration leaves singular values near 1, not exactly 1
    assert 0.5 < s.min() and s.max() < 1.3
    # one step from zero momentum: p <- p (1 - lr wd) - lr * ratio * NS(g (1 - mu) lerp ...)
    p = torch.randn(48, 20, generator=gen).requires_grad_()
    start = p.detach().clone()
    opt = Fp32Muon([p], lr=0.05, momentum=0.9, nesterov=False, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    p.grad = g.clone()
    opt.step()
    expected = start * (1 - 0.05 * 0.1) - 0.05 * 0.2 * 48 ** 0.5 * orthogonalize(0.1 * g, coefficients, 5, 1e-7, torch.float32)
    assert torch.allclose(p.detach(), expected, atol=1e-6)
    assert torch.equal(opt.state[p]["momentum_buffer"], 0.1 * g)


@needs_muon
def test_muon_precision_auto_is_fp32_on_the_cpu_and_names_its_choices():
    from llmlab.train.optim import Fp32Muon, ns_precision
    model = tiny_model()
    muon = build_optimizer(OPTIMIZER.config({"kind": "muon"}, "optim"), model, torch.device("cpu")).optimizers[0]
    assert isinstance(muon, Fp32Muon) and muon.ns_dtype == torch.float32
    muon = build_optimizer(OPTIMIZER.config({"kind": "muon", "ns_precision": "bf16"}, "optim"), model,
                           torch.device("cpu")).optimizers[0]
    assert type(muon) is torch.optim.Muon
    assert ns_precision("auto", torch.device("cuda")) == "bf16" and ns_precision("fp32", torch.device("cuda")) == "fp32"
    with pytest.raises(ConfigError, match=r"^optim\.ns_precision: unknown 'fp16'; allowed: auto, bf16, fp32$"):
        OPTIMIZER.config({"kind": "muon", "ns_precision": "fp16"}, "optim")


def test_muon_trains_on_a_torch_without_its_muon(monkeypatch):
    """optim=muon is the default run's optimizer, and torch < 2.9 has no torch.optim.Muon:
    Fp32Muon needs none, and takes the bf16 iterations there too."""
    from llmlab.train.optim import Fp32Muon
    monkeypatch.delattr(torch.optim, "Muon", raising=False)
    model = tiny_model()
    for precision, dtype in (("auto", torch.float32), ("bf16", torch.bfloat16)):
        opt = build_optimizer(OPTIMIZER.config({"kind": "muon", "ns_precision": precision}, "optim"), model,
                              torch.device("cpu"))
        muon = opt.optimizers[0]
        assert type(muon) is Fp32Muon and muon.ns_dtype == dtype
    before = model.blocks[0].attn.qkv_proj.weight.detach().clone()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    assert not torch.equal(model.blocks[0].attn.qkv_proj.weight, before)
    with pytest.raises(ValueError, match="2-D parameters only"):
        Fp32Muon([torch.zeros(3, requires_grad=True)])


@needs_muon
def test_muons_defaults_are_torchs():
    """Fp32Muon writes torch.optim.Muon's defaults down (torch < 2.9 has none to read)."""
    import inspect

    from llmlab.train.optim import MUON_DEFAULTS
    signature = inspect.signature(torch.optim.Muon.__init__).parameters
    assert {k: signature[k].default for k in MUON_DEFAULTS} == MUON_DEFAULTS


@pytest.mark.parametrize("kind", SCHEDULE.names())
def test_a_warmup_share_is_the_same_schedule_as_the_equivalent_steps(kind):
    by_share = SCHEDULE.build(SCHEDULE.config({"kind": kind, "warmup_share": 0.1}, "sched"), 240)
    by_steps = SCHEDULE.build(SCHEDULE.config({"kind": kind, "warmup": 24}, "sched"), 240)
    assert by_share.warmup == 24
    assert [by_share(i) for i in range(240)] == [by_steps(i) for i in range(240)]


def test_an_unset_warmup_is_50_steps_or_5_percent_of_a_budget_run():
    unset = SCHEDULE.config({"kind": "cosine"}, "sched")
    assert SCHEDULE.build(unset, 1000).warmup == 50  # what sched.warmup always meant
    assert SCHEDULE.build(unset, 1000, budget_run=True).warmup == 50  # 5% of 1000
    assert SCHEDULE.build(unset, 72, budget_run=True).warmup == 4  # not 50 of 72 steps
    assert SCHEDULE.build(SCHEDULE.config({"kind": "cosine", "warmup": 30}, "sched"), 72, budget_run=True).warmup == 30
    assert SCHEDULE.build(unset, 20).warmup == 20  # never longer than the run


def test_warmup_and_warmup_share_together_name_the_key():
    with pytest.raises(ConfigError, match=r"^sched.warmup_share: set either sched.warmup \(steps\) or sched.warmup_share"):
        SCHEDULE.config({"kind": "cosine", "warmup": 10, "warmup_share": 0.1}, "sched")
    with pytest.raises(ConfigError, match=r"^sched.warmup_share: must be in \[0, 1\), got 1.5"):
        SCHEDULE.config({"kind": "cosine", "warmup_share": 1.5}, "sched")


def test_adamw_on_the_cpu_takes_the_fused_kernel_and_steps_as_foreach_does():
    """The fused kernel (one pass per tensor) is the CPU's AdamW too, and it moves the weights
    as the foreach implementation does. The two round differently, and a CPU reduction's last bits
    can move with where its tensors lie in memory; where a gradient is as small as eps, Adam's
    normalisation magnifies that to ~1e-4 of a step (one element in 3,072, in one full run of
    the suite; at most 1.2e-4 over 40 seeds), so the weights are compared to 1e-3 of one step,
    lr."""
    cfg = OPTIMIZER.config({"kind": "adamw", "lr": 1e-2, "weight_decay": 0.1}, "optim")
    models = [tiny_model(), tiny_model()]
    models[1].load_state_dict(models[0].state_dict())
    start = {k: v.clone() for k, v in models[0].state_dict().items()}
    fused = build_optimizer(cfg, models[0], torch.device("cpu"))
    assert fused.defaults["fused"] is True
    foreach = torch.optim.AdamW(param_groups(models[1], 0.1), lr=1e-2, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                foreach=True)
    x = torch.randint(0, models[0].vocab_size, (2, 16))
    for _ in range(3):
        for model, opt in zip(models, (fused, foreach)):
            model(x, x).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    moved = 0
    for (name, a), b in zip(models[0].state_dict().items(), models[1].state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-3 * cfg.lr)
        moved += not torch.equal(a, start[name])
    assert moved >= len(start) // 2


@pytest.mark.parametrize("kind", SCHEDULE.names())
def test_every_schedule_warms_up_linearly_then_never_rises_or_leaves_zero_to_one(kind):
    """What the loop and cooldown branches take from any schedule: the warm-up climbs from
    1/warmup to the peak in equal steps, and after it the multiplier stays in (0, 1] and never
    rises again."""
    s = SCHEDULE.build(SCHEDULE.config({"kind": kind, "warmup": 8}, "sched"), 200)
    rates = [s(step) for step in range(200)]
    assert rates[:8] == pytest.approx([(i + 1) / 8 for i in range(8)])
    after = rates[8:]
    assert all(0 <= r <= 1 for r in after) and all(b <= a + 1e-12 for a, b in zip(after, after[1:]))


def test_inverse_sqrt_falls_as_one_over_the_root_of_the_steps():
    s = SCHEDULE.build(SCHEDULE.config({"kind": "inverse_sqrt", "warmup": 10}, "sched"), 10_000)
    assert s(9) == 1.0  # the peak ends the warm-up
    assert s(9 + 10) == pytest.approx(2 ** -0.5)  # one timescale (the warm-up's 10 steps) later
    assert s(9 + 30) == pytest.approx(0.5) and s(9 + 990) == pytest.approx(0.1)
    longer = SCHEDULE.build(SCHEDULE.config({"kind": "inverse_sqrt", "warmup": 10}, "sched"), 20_000)
    assert [longer(i) for i in range(10_000)] == [s(i) for i in range(10_000)]  # no end: a longer run agrees
    slow = SCHEDULE.build(SCHEDULE.config({"kind": "inverse_sqrt", "warmup": 10, "timescale": 100}, "sched"), 1000)
    assert slow(9 + 100) == pytest.approx(2 ** -0.5)
