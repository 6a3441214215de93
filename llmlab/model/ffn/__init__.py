"""Position-wise feed-forward networks (config group ``model/ffn``, settings under ``ffn.*``).

A kind subclasses `FeedForward` and is built as every registered part is, from its Config and
the sizes it is given: ``cls(cfg, d_model, bias)``. ``forward(x)`` maps (B, T, d) to (B, T, d);
a sparse kind (a mixture of experts) also says which of its parameters a token leaves idle and
hands over its auxiliary losses after each forward, under its ``aux_name``.

A new kind can be one file in this package: its class, registered with
``@FFN.register(name)``, holding a nested ``Config`` dataclass (a subclass of `FFNConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from llmlab.errors import ConfigError
from llmlab.model.config import FFN, FFNConfig, SwiGLUConfig
from llmlab.registry import Checked, bounded


def round_up(n: float, multiple: int) -> int:
    return int(-(-n // multiple) * multiple)


class FeedForward(nn.Module):
    """The base of every FFN kind."""

    #: True where some parameters get no gradient in a step (DDP must look for unused ones)
    sparse = False
    #: the name its auxiliary losses are logged under (``moe/balance_loss``); None: it has none
    aux_name: str | None = None
    #: settings that keep a test model small (tests build every registered kind with them)
    test_settings: dict = {}

    @staticmethod
    def default_hidden(d_model: int) -> int:
        return 4 * d_model

    def hidden_width(self, cfg: FFNConfig, d_model: int) -> int:
        return cfg.hidden or self.default_hidden(d_model)

    def residual_projections(self) -> list[nn.Linear]:
        """The projections that write into the residual stream (their init is scaled down)."""
        return [self.down_proj]

    def same_input_linears(self) -> list[tuple[nn.Linear, ...]]:
        """Groups of linear layers that every forward applies to one and the same input, as
        they are; decoding may multiply each group as one product
        (`llmlab.model.packing`)."""
        return []

    def inactive_params(self) -> int:
        """Parameters a token does not use (experts it is not routed to): for active FLOPs."""
        return 0

    def take_aux(self) -> dict[str, torch.Tensor]:
        """Auxiliary losses and metrics of the last forward (``weighted``: added to the loss)."""
        return {}


class TwoMatrixFFN(FeedForward):
    """d -> hidden -> activation -> d."""

    def __init__(self, cfg: FFNConfig, d_model: int, bias: bool):
        super().__init__()
        hidden = self.hidden_width(cfg, d_model)
        self.up_proj = nn.Linear(d_model, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, d_model, bias=bias)

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation(self.up_proj(x)))


@FFN.register("gelu")
class GeluFFN(TwoMatrixFFN):
    """The GPT-2 / BERT MLP with the exact (erf) GELU of Hendrycks & Gimpel 2016."""

    @dataclass
    class Config(FFNConfig):
        kind: str = "gelu"

    approximate = "none"

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(h, approximate=self.approximate)


@FFN.register("gelu_tanh")
class GeluTanhFFN(GeluFFN):
    """The same MLP with GELU's tanh approximation, as the original GPT-2 code has it
    (``gelu_new`` in transformers). About 3x the cost of the exact GELU on a CPU."""

    @dataclass
    class Config(FFNConfig):
        kind: str = "gelu_tanh"

    approximate = "tanh"


@FFN.register("relu2")
class ReluSquaredFFN(TwoMatrixFFN):
    """Squared ReLU (So et al. 2021, Primer, section 4)."""

    @dataclass
    class Config(FFNConfig):
        kind: str = "relu2"

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return F.relu(h).square()


@FFN.register("swiglu")
class SwiGLU(FeedForward):
    """Shazeer 2020, GLU Variants: down(silu(gate(x)) * up(x)).

    The default hidden size is 8/3 d, so three matrices cost what the 4d MLP's two do,
    rounded up to a multiple of 64 for the kernels.
    """

    @staticmethod
    def default_hidden(d_model: int) -> int:
        return round_up(8 * d_model / 3, 64)

    def __init__(self, cfg: FFNConfig, d_model: int, bias: bool):
        super().__init__()
        hidden = self.hidden_width(cfg, d_model)
        self.gate_proj = nn.Linear(d_model, hidden, bias=bias)
        self.up_proj = nn.Linear(d_model, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, d_model, bias=bias)

    def same_input_linears(self) -> list[tuple[nn.Linear, ...]]:
        return [(self.gate_proj, self.up_proj)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@FFN.register("geglu")
class GeGLU(SwiGLU):
    """GEGLU (Shazeer 2020): down(gelu(gate(x)) * up(x)) with the tanh GELU, as in Gemma."""

    @dataclass
    class Config(FFNConfig):
        kind: str = "geglu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


@FFN.register("moe")
class MoE(FeedForward):
    """Mixture of SwiGLU experts with a learned top-k router (Shazeer et al. 2017; Fedus et al.
    2022, Switch Transformer, for the balance loss and jitter; DeepSeekMoE for shared experts).

    Dispatch is vectorised: assignments are sorted by expert and each expert runs once on
    its slice of tokens, so the only Python loop is over experts.
    """

    @dataclass
    class Config(FFNConfig, Checked):
        """``model/ffn=moe``: routed SwiGLU experts; ``hidden`` is each expert's width."""

        kind: str = "moe"
        n_experts: int = bounded(8, at_least=1)
        top_k: int = bounded(2, at_least=1)
        shared_experts: int = bounded(0, at_least=0)  # always-on experts beside the routed ones (DeepSeekMoE)
        jitter: float = bounded(0.0, at_least=0, below=1)  # router input multiplied by U(1 - jitter, 1 + jitter) in training
        balance_coef: float = bounded(0.01, at_least=0)  # weight of the Switch load-balancing loss (per MoE layer)

        def check(self, prefix: str) -> None:
            if self.top_k > self.n_experts:
                raise ConfigError(f"{prefix}.top_k: must be in [1, {prefix}.n_experts={self.n_experts}], got {self.top_k}")

    sparse = True
    aux_name = "moe"
    test_settings = {"n_experts": 4, "top_k": 2, "shared_experts": 1}

    def __init__(self, cfg: "MoE.Config", d_model: int, bias: bool):
        super().__init__()
        self.cfg = cfg
        expert = SwiGLUConfig(hidden=cfg.hidden)  # ``hidden`` is each expert's width
        self.router = nn.Linear(d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(expert, d_model, bias) for _ in range(cfg.n_experts))
        self.shared = nn.ModuleList(SwiGLU(expert, d_model, bias) for _ in range(cfg.shared_experts))
        self._aux: dict[str, torch.Tensor] = {}
        self.last_routing: torch.Tensor | None = None

    def residual_projections(self) -> list[nn.Linear]:
        return [e.down_proj for e in [*self.experts, *self.shared]]

    def inactive_params(self) -> int:
        """Parameters of the experts a token is not routed to (for active-parameter FLOPs)."""
        per_expert = sum(p.numel() for p in self.experts[0].parameters())
        return per_expert * (self.cfg.n_experts - self.cfg.top_k)

    def take_aux(self) -> dict[str, torch.Tensor]:
        aux, self._aux = self._aux, {}
        return aux

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, d)
        n, E, k = flat.shape[0], self.cfg.n_experts, self.cfg.top_k
        router_in = flat
        if self.training and self.cfg.jitter > 0:
            noise = torch.empty_like(flat).uniform_(1 - self.cfg.jitter, 1 + self.cfg.jitter)
            router_in = flat * noise
        probs = self.router(router_in).float().softmax(dim=-1)  # (N, E)
        top_w, top_i = probs.topk(k, dim=-1)  # (N, k)
        top_w = (top_w / top_w.sum(dim=-1, keepdim=True)).to(x.dtype)
        self.last_routing = top_i

        expert_of = top_i.reshape(-1)  # (N k,) row-major: token t's slots at t*k ... t*k+k-1
        order = expert_of.argsort(stable=True)
        token_of = order // k
        counts = torch.bincount(expert_of, minlength=E)
        x_sorted = flat[token_of]  # (N k, d), grouped by expert
        y_sorted = torch.empty_like(x_sorted)
        start = 0
        for e, count in enumerate(counts.tolist()):
            if count:
                y_sorted[start:start + count] = self.experts[e](x_sorted[start:start + count])
            start += count
        out = torch.zeros_like(flat).index_add_(0, token_of, y_sorted * top_w.reshape(-1)[order, None])
        for expert in self.shared:
            out = out + expert(flat)

        # Switch balance loss: E * sum_i f_i P_i, f = share of assignments, P = mean router prob.
        load = counts.float() / (n * k)
        balance = E * (load * probs.mean(dim=0)).sum()
        self._aux = {"weighted": self.cfg.balance_coef * balance, "balance_loss": balance,
                     "load_max": load.max() * E, "load_min": load.min() * E}
        return out.reshape(shape)
