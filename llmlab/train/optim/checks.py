"""What a checkpoint's optimizer state must be before and after it loads (`load_optimizer_state`
in ``llmlab.train.distributed``): rules of the optimizers themselves, which a hand-edited
``trainer.pt`` can break without the loader noticing."""

from __future__ import annotations

import torch


def check_same_entries(saved: dict, groups, params: dict) -> None:
    """An entry deleted from one parameter's saved state (a moment, its step) would load as a
    fresh one without a word: the loader starts every state before it copies the saved one in.
    Within a saved group, each parameter of a kind (vectors, matrices: Adafactor factors only
    the latter) holds the entries the others of its kind hold. ValueError naming the first
    that does not."""
    for group in groups if isinstance(groups, list) else []:
        names = group.get("params") if isinstance(group, dict) else None
        first: dict[bool, tuple[frozenset, str]] = {}
        for name in names if isinstance(names, list) else []:
            if name not in saved or name not in params:
                continue  # never stepped, or not this model's: the load says so
            keys = frozenset(saved[name])
            other = first.setdefault(params[name].dim() > 1, (keys, name))
            if keys != other[0]:
                raise ValueError(f"the state of {name} holds {', '.join(sorted(keys)) or 'nothing'}, but that of "
                                 f"{other[1]} holds {', '.join(sorted(other[0]))}")


# state entries shaped as their parameter (AdamW, RAdam, Lion, SGD, Muon, Adafactor's 1-D)
PARAM_SHAPED = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "variance"})


def check_optimizer_state(opt, configured: list[dict], names: dict[int, str]) -> None:
    """What a checkpoint put into ``opt`` is what this optimizer makes itself: each group's
    settings of the kinds the run configured (``configured``: its groups before the load; flags
    such as ``maximize`` unchanged, numbers finite and not negative, ``betas`` in [0, 1)), and each
    parameter's state finite tensors, its moments shaped and typed as the parameter needs, its
    step one count. ValueError naming the first that is not."""
    import math

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if len(opt.param_groups) != len(configured):
        raise ValueError(f"{len(opt.param_groups)} parameter groups where the optimizer has {len(configured)}")
    for i, (group, mine) in enumerate(zip(opt.param_groups, configured)):
        for key, want in mine.items():
            got = group.get(key)
            if key == "params":
                continue
            if key in ("fused", "foreach"):  # which kernel ran: a checkpoint of another kernel loads
                ok = got is None or isinstance(got, bool)
            elif isinstance(want, bool) or want is None or isinstance(want, str):
                ok = got == want  # maximize, amsgrad, differentiable...: what the run configured
            elif number(want) or key in ("lr", "initial_lr"):
                ok = number(got) and (got >= 0 or key not in ("lr", "initial_lr", "eps", "weight_decay"))
            elif isinstance(want, (tuple, list)):  # betas; Adafactor's eps (None, 1e-3)
                ok = isinstance(got, (tuple, list)) and len(got) == len(want) and all(
                    (v is None) if w is None else (number(v) and (key != "betas" or 0 <= v < 1))
                    for v, w in zip(got, want))
            else:
                ok = type(got) is type(want)
            if not ok:
                raise ValueError(f"parameter group {i}'s {key} is {str(got)[:40]}, which this optimizer cannot take")
    for group in opt.param_groups:
        for p in group["params"]:
            name = names.get(id(p), "a parameter")
            shaped = ({"row_var": p.shape[:-1] + (1,), "col_var": p.shape[:-2] + (1,) + p.shape[-1:]}
                      if p.dim() > 1 else {})  # Adafactor's factored second moment
            for key, value in (opt.state.get(p) or {}).items():
                if not torch.is_tensor(value):
                    raise ValueError(f"the {key} of {name} is a {type(value).__name__}, not a tensor")
                if not bool(torch.isfinite(value).all()):
                    raise ValueError(f"the {key} of {name} is not finite")
                if key == "step":
                    if value.numel() != 1 or float(value) < 0:
                        raise ValueError(f"the step of {name} is not one count")
                    continue
                want = shaped.get(key, p.shape if key in PARAM_SHAPED else None)
                if want is not None and (value.shape != want or value.dtype != p.dtype):
                    raise ValueError(f"the {key} of {name} is {value.dtype} {tuple(value.shape)}, not {p.dtype} "
                                     f"{tuple(want)} as the parameter needs")
