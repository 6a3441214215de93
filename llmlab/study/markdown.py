"""The scaling section in words: its markdown (tables, hold-out, decisions), the terminal's
lines and scaling.png. A variant is named by what sets it apart from the others.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmlab.eval.runs import some_of
from llmlab.study import design as de
from llmlab.study import frontier as fr
from llmlab.study import surface as su
from llmlab.study.holdout import decisions
from llmlab.study.section import SHORT_RUN, curve


def _g(v, digits=3) -> str:
    return "n/a" if v is None else f"{v:.{digits}g}"


def _ci(ci, digits=3) -> str:
    return "" if ci is None else f" [{_g(ci[0], digits)}, {_g(ci[1], digits)}]"


# the surface of each form (`scaling.FORMS`), as the report writes it
FORMULA = {"chinchilla": "L(N, D) = E + A·N^-α + B·D^-β",
           "auto": "of the form each variant's nested hold-out chose (`surface=auto`, below)",
           "kaplan": "L(N, D) = E + ((A·N^-α)^(1/β) + (B·D^-β)^(1/β))^β (Kaplan et al. 2020's form, `surface=kaplan`: "
                     "size and tokens interact; with much data it is E + A·N^-α, with a large model E + B·D^-β)"}


def formula_line(s: dict) -> str:
    """A fitted surface in one line, in its own form."""
    if s.get("form") == "kaplan":
        return (f"L = {s['e']:.3f} + (({s['a']:.3g}/N^{s['alpha']:.3f})^(1/{s['beta']:.3f}) + "
                f"({s['b']:.3g}/D^{s['beta']:.3f})^(1/{s['beta']:.3f}))^{s['beta']:.3f}")
    return f"L = {s['e']:.3f} + {s['a']:.3g}/N^{s['alpha']:.3f} + {s['b']:.3g}/D^{s['beta']:.3f}"


def markdown(section: dict, figure: str | None) -> list[str]:
    names = de.variant_names(list(section["variants"]))
    named = [f"`{n}`: `{label}`" for label, n in names.items() if n != label]
    head = ["", "## Scaling: which variant wins at which budget", "",
            *([f"Variants by what sets them apart: {'; '.join(named)} (report.json keeps every override).", ""]
              if named else [])]
    return head + de.rename(_markdown(section, figure), names)


def _markdown(section: dict, figure: str | None) -> list[str]:
    out = [f"Budget axis `{section['budget_key']}`, size axis {', '.join(f'`{k}`' for k in section['size_keys'])}. "
           f"Surface {FORMULA[section.get('form', 'chinchilla')]} fitted per variant by variable projection, with **N the "
           + ("non-embedding parameters" if section.get("size", "params") == "params" else
              "training FLOPs per token / 6 (`scaling.size=flops`: attention and the head counted)")
           + " and D the training tokens**; C is training FLOPs by the model card "
           "(FLOPs/token × tokens, the count `train.max_flops` uses). Brackets: 95% bootstrap intervals.", ""]
    out += chosen_markdown(section.get("chosen") or {})
    if section.get("left_out"):
        out += [f"Left out of the fit: {section['left_out']} of the {section['runs']} runs, those of fewer than "
                f"{section['min_steps']:,} steps (`min_steps={section['min_steps']}`).", ""]
    if section.get("unplaced"):
        gone = section["unplaced"]
        out += [f"Left out of the fit: {len(gone)} run{'s' if len(gone) > 1 else ''} whose summary.json does not say "
                f"`params_non_embedding` and `tokens`: {some_of(gone)}.", ""]
    if section.get("steps_unknown"):
        out += [f"{section['steps_unknown']} of the runs do not say their steps (no whole number at `steps` in "
                "summary.json), so `min_steps` cannot judge them: they are fitted.", ""]
    if section.get("short"):
        out += [f"{section['short']} of the runs fitted have fewer than {SHORT_RUN:,} steps. In so short a run a larger "
                "model is held back by its few steps, which the surface does not model, and a fit on them can "
                "mislead (see the hold-out check); "
                f"`min_steps={SHORT_RUN}` fits without them.", ""]
    out += ["| variant | runs | E | A | α | B | β | rmse | bootstrap |", "|" + " --- |" * 9]
    for label, v in section["variants"].items():
        if "surface" not in v:
            out.append(f"| {label} | | {v['why']} | | | | | | |")
            continue
        s, ci = v["surface"], v["ci"]
        out.append(f"| {label} | {v['points']} | " + " | ".join(
            f"{_g(s[k])}{_ci(ci[k])}" for k in ("e", "a", "alpha", "b", "beta"))
            + f" | {s['rmse']:.4f} | {v['bootstrap']['replicates']} over {v['bootstrap']['over']} |")
    for label, v in section["variants"].items():
        if v.get("surface", {}).get("at_bounds"):
            out += ["", f"**⚠ {label}: {', '.join(v['surface']['at_bounds'])}: on a bound of the fit, so the runs do "
                    "not pin it down (too few sizes or budgets, or sizes past the point where size still helps); "
                    "the optimum and crossings below lean on that bound.**"]
    out += ["", "Compute-optimal size, tokens and loss at each measured budget (from the surface), and the IsoFLOP "
            "parabola's vertex at that budget as a cross-check:", "",
            "| variant | budget (FLOPs) | N* | D* | L* | IsoFLOP N* | grid |", "|" + " --- |" * 7]
    flagged = False
    for label, v in section["variants"].items():
        for b in v.get("per_budget", []):
            iso = b["isoflop"]
            iso_text = "n/a (< 3 sizes)" if iso is None else (iso["why"] or _g(iso["n"]))
            grid = ("off-centre ⚠" + (f" (best: the {b['best_at_end']} size)" if b.get("best_at_end") else "")
                    if b["isoflop_off_centre"] else "centred")
            flagged |= b["isoflop_off_centre"]
            out.append(f"| {label} | {b['budget']:.3g} | {_g(b['n_opt'])}{_ci(b['n_opt_ci'])}"
                       f"{' (at the search edge)' if b['at_edge'] else ''} | {_g(b['d_opt'])}{_ci(b['d_opt_ci'])} | "
                       f"{b['loss_opt']:.4f}{_ci(b['loss_opt_ci'], 4)} | {iso_text} | {grid} |")
    if flagged:
        out += ["", "**⚠ off-centre: the optimum lies outside the middle half of the sizes' log span at that budget, "
                "or the best size run there is the smallest or the largest. There the IsoFLOP parabola's vertex is "
                "biased (Czech et al. 2026); widen the sizes toward N* and trust the surface's N* over the parabola's.**"]
    out += ["", f"Crossings of the optimal-loss curves L*(C), searched from {section['search'][0]:.3g} to "
            f"{section['search'][1]:.3g} FLOPs; the measured budgets span {section['measured'][0]:.3g} to "
            f"{section['measured'][1]:.3g}, and a crossing beyond them is an extrapolation of the fits.", ""]
    out += [crossing_line(c, f"{c['first']} vs {c['second']}") for c in section["crossings"]]
    if not section["crossings"]:
        out.append("- (one variant only)")
    out += frontier_markdown(section.get("frontier") or {})
    out += holdout_markdown(section.get("holdout") or [])
    grids = section.get("next_grid") or {}
    if grids:
        out += ["", "Next grid: sizes that centre each budget's grid on this fit's N* (spaced as the grid that was run):",
                "", "```"]
        out += [g.get("command") or f"# {label}: {g['why']}" for label, gs in grids.items() for g in gs]
        out += ["```"]
    if figure:
        out += ["", f"![loss vs compute]({figure})"]
    return out


def chosen_markdown(chosen: dict[str, dict]) -> list[str]:
    """``surface=auto``'s choice per variant, with the nested hold-out's errors behind it."""
    if not chosen:
        return []
    out = ["Form per variant (`surface=auto`): each form fitted without the two largest budgets predicts the second "
           "largest budget's best loss; the closer one is the variant's surface (the largest budget, kept for the "
           "hold-out check, plays no part).", "",
           "| variant | fitted on | predicted budget | " + " | ".join(f"{f}: error" for f in su.FORMS) + " | form |",
           "|" + " --- |" * (4 + len(su.FORMS))]
    for label, c in chosen.items():
        if "errors" not in c:
            out.append(f"| {label} | | | " + " | " * (len(su.FORMS) - 1) + f" | {c['form']} ({c['why']}) |")
            continue
        out.append(f"| {label} | {', '.join(f'{b:.3g}' for b in c['fitted_on'])} | {c['budget']:.3g} | "
                   + " | ".join(f"{c['errors'][f]:+.2%}" for f in su.FORMS) + f" | **{c['form']}** |")
    return out + [""]


def crossing_line(c: dict, pair: str) -> str:
    """One crossing (of two surfaces' L*(C), or of two frontiers) as a list item."""
    share = c["share_of_replicates"]
    if c["budget"] is None:
        return (f"- {pair}: no crossing in the searched range; lower at the largest budget: "
                f"{c['lower_at_largest_budget']}" + (f" ({share:.0%} of bootstrap replicates do cross)" if share else ""))
    return (f"- {pair}: cross at {c['budget']:.3g} FLOPs{_ci(c['ci'])} "
            + (f"({share:.0%} of bootstrap replicates cross)" if share is not None else "(no bootstrap: one seed per cell)")
            + (" — an extrapolation beyond the measured budgets" if c["extrapolated"] else ""))


def frontier_markdown(front: dict) -> list[str]:
    """The frontier per variant (`frontier_section`) and where two frontiers cross."""
    if not front.get("variants"):
        return []
    out = ["", "Frontier: the lowest loss run at each budget, fitted by L*(C) = (C_c / C)^γ, a power law with no "
           "floor (Kaplan et al. 2020's L(C_min)); brackets: 95% bootstrap over seeds.", "",
           "| variant | γ | C_c | best loss per budget (size) |", "|" + " --- |" * 4]
    for label, v in front["variants"].items():
        if "why" in v:
            out.append(f"| {label} | n/a: {v['why']} | | |")
            continue
        points = ", ".join(f"{p['budget']:.3g}: {p['loss']:.4f} ({_g(p['n'])})" for p in v["best"])
        if v.get("not_bracketed"):
            points += "; left out, their sizes do not bracket the optimum: " + ", ".join(
                f"{b:.3g}" for b in v["not_bracketed"])
        out.append(f"| {label} | {v['gamma']:.4f}{_ci(v['gamma_ci'], 3)} | {_g(v['c_c'])} | {points} |")
    if front.get("crossings"):
        out.append("")
    out += [crossing_line(c, f"frontiers of {c['first']} and {c['second']}") for c in front.get("crossings", [])]
    return out


def _drift_words(held: list[dict]) -> str:
    d = next((h["frontier"]["drift"] for h in held if (h.get("frontier") or {}).get("drift")), None)
    return (f", then moved by this lab's drift: on {d['studies']} past variant-studies ({d['budgets'][0]:.3g} to "
            f"{d['budgets'][1]:.3g} FLOPs) the held-out loss fell {-d['rate']:.4f} further per unit of ln C than "
            "the fitted line said (sd " f"{d['sd']:.4f}). Its interval is the seed interval (each budget's own seed "
            "noise) moved with it and widened by that spread at the distance extrapolated, in quadrature. A study far "
            "from those budgets, models or recipes sets `scaling.drift=none`: the line, its interval widened by its "
            "own leave-one-budget-out error")


def holdout_markdown(held: list[dict]) -> list[str]:
    if not held:
        return []
    out = ["", "Hold-out check: each variant's surface fitted without the largest budget predicts that budget's best "
           "loss (the lowest over its sizes). Interval: 95% prediction interval (the bootstrap's fits plus the seed "
           "noise of the observed mean).", "",
           "The frontier's columns are the route the decisions lead with: the best loss at each smaller budget, "
           "fitted by a power law in C with no floor (above), extrapolated to the largest"
           + (_drift_words(held) if any((h.get("frontier") or {}).get("drift") for h in held) else
              ". Its interval (each budget's own seed noise) also carries the law's own error: the RMS of its "
              "leave-one-budget-out errors on the smaller budgets, widened for their few number (Student t) and for "
              "how many budget steps the held-out budget lies past them, added in quadrature (with two fitted "
              "budgets there is none to measure, and the interval is the seeds' alone)")
           + ". Where the two routes "
           "disagree, the observed loss says which assumption held: the surface's floor E, or none within reach.", "",
           "| variant | held-out budget | fitted on | surface: predicted (95% PI) | error | frontier: predicted (95% PI) "
           "| error | observed |", "|" + " --- |" * 8]
    for h in held:
        f = h.get("frontier")
        front = ("n/a | n/a" if f is None else f"n/a: {f['why']} | n/a" if "why" in f
                 else f"{f['predicted']:.4f}{_ci(f['interval'], 4)} | {f['error']:+.2%}")
        out.append(f"| {h['variant']} | {h['budget']:.3g} | {', '.join(f'{b:.3g}' for b in h['fitted_on'])} | "
                   f"{h['predicted']:.4f}{_ci(h['interval'], 4)} | {h['error']:+.2%} | {front} | {h['observed']:.4f} |")
    out += decisions_markdown(held)
    for h in held:
        if not h["within_interval"]:
            out += ["", f"**⚠ hold-out miss: {h['variant']}: the best loss at {h['budget']:.3g} FLOPs was {h['observed']:.4f}, "
                    f"outside the interval{_ci(h['interval'], 4)} of the fit on the smaller budgets: the surface does "
                    "not extrapolate, so its optimum and crossings beyond the measured budgets are not to be trusted"
                    + ("" if h["surface"].get("form") == "kaplan" else
                       " (where size and tokens interact, as in short runs, `surface=kaplan` may fit)") + ".**"]
        f = h.get("frontier")
        if f is not None and "why" not in f and not f["within_interval"]:
            out += ["", f"**⚠ frontier miss: {h['variant']}: the best loss at {h['budget']:.3g} FLOPs was "
                    f"{h['observed']:.4f}, outside the interval{_ci(f['interval'], 4)} of the power law in C fitted on "
                    "the smaller budgets' best losses"
                    + (" (observed above it: a floor the smaller budgets did not show)" if f["error"] > 0 else "")
                    + ".**"]
        if h["surface"].get("at_bounds"):
            out += ["", f"**⚠ {h['variant']}: the hold-out fit has {', '.join(h['surface']['at_bounds'])}: on a bound "
                    "of the fit, so its prediction leans on that bound.**"]
    return out


def decisions_markdown(held: list[dict], pairs: list[dict] | None = None) -> list[str]:
    """What a user decides from the hold-out, said as such: which variant is lower at the
    held-out budget (decided where the gap's 95% interval excludes 0) against the observed
    order, and each variant's predicted compute-optimal size against the size observed best."""
    pairs = decisions(held) if pairs is None else pairs
    lines = []
    for d in pairs:
        lower, higher = (d["first"], d["second"]) if d["gap"] < 0 else (d["second"], d["first"])
        lo, hi = d["interval"]
        verdict = ("decided" if d["decided"] else "not decided: the interval holds 0")
        seen = "agrees" if d["agrees"] else "**the observed order is the other**"
        lines.append(f"- Order at the held-out budget: {lower} predicted lower than {higher} by "
                     f"{abs(d['gap']):.2%} (95% interval of ln L_{d['first']}/L_{d['second']}: [{lo:+.2%}, {hi:+.2%}]; "
                     f"{verdict}); observed gap {d['observed_gap']:+.2%}: {seen}.")
    for h in held:
        if h.get("size_steps") is not None:
            lines.append(f"- {h['variant']}: compute-optimal size predicted {_g(h['predicted_size'])} (the surface's "
                         f"optimum among the sizes run there), observed best {_g(h['observed_size'])}: "
                         f"{h['size_steps']} grid step{'s' if h['size_steps'] != 1 else ''} apart.")
    return ["", "Decisions at the held-out budget (the order by the frontier, the size by the surface):", "",
            *lines] if lines else []


def figure(section: dict, path: Path) -> Path | None:
    from llmlab.eval.plots import scaling_plot

    lo, hi = section["measured"][0] / 3, section["measured"][1] * 3
    budgets = np.logspace(np.log10(lo), np.log10(hi), 80)
    names = de.variant_names(list(section["variants"]))
    series = {}
    for label, v in section["variants"].items():
        cells = v.get("_cells") or []
        entry = {"points": ([c.c for c in cells for _ in c.losses], [x for c in cells for x in c.losses])}
        if "_fit" in v:
            entry["x"] = budgets
            entry["fit"] = curve(v)(budgets)
            if v["_boots"]:
                band = np.array([curve(v, b)(budgets) for b in v["_boots"]])
                entry["lo"], entry["hi"] = np.quantile(band, 0.025, axis=0), np.quantile(band, 0.975, axis=0)
        front = (section.get("frontier") or {}).get("variants", {}).get(label, {})
        if "gamma" in front:
            entry["x"] = budgets
            entry["frontier"] = fr.Frontier(front["log_g"], front["gamma"]).loss(budgets)
        series[names[label]] = entry
    if not any(e["points"][0] for e in series.values()):
        return None
    return scaling_plot(series, path)


def _frontier_words(f: dict | None) -> str:
    if f is None:
        return ""
    if "why" in f:
        return f"; the frontier: n/a ({f['why']})"
    return (f"; the frontier (best loss per budget, a power law in C) predicts {f['predicted']:.4f}{_ci(f['interval'], 4)} "
            f"({f['error']:+.2%}" + ("" if f["within_interval"] else ", outside its interval") + ")")


def scaling_lines(section: dict) -> list[str]:
    """The scaling section in a few lines for the terminal (report.md has the tables), each
    variant by its name (`variant_names`)."""
    return de.rename(_scaling_lines(section), de.variant_names(list(section["variants"])))


def _scaling_lines(section: dict) -> list[str]:
    out = []
    if section.get("unplaced"):
        out.append(f"scaling: left out of the fit: {len(section['unplaced'])} run(s) whose summary.json does not say "
                   "params_non_embedding and tokens (report.md names them)")
    for label, c in (section.get("chosen") or {}).items():
        out.append(f"scaling: {label}: surface=auto chose {c['form']} ("
                   + (", ".join(f"{f} {e:+.2%}" for f, e in c["errors"].items())
                      + f" at {c['budget']:.3g} FLOPs, fitted below it" if "errors" in c else c["why"]) + ")")
    for label, v in section["variants"].items():
        if "surface" not in v:
            out.append(f"scaling: {label}: {v['why']}")
            continue
        s = v["surface"]
        optima = "; ".join(f"C={b['budget']:.2g}: N*={b['n_opt']:.3g}, L*={b['loss_opt']:.3f}"
                           + (" (IsoFLOP grid off-centre)" if b["isoflop_off_centre"] else "") for b in v["per_budget"])
        out.append(f"scaling: {label}: {formula_line(s)}"
                   + (f" (on a bound: {', '.join(s['at_bounds'])})" if s.get("at_bounds") else "") + "; " + optima)
    for h in section.get("holdout") or []:
        out.append(f"scaling: {h['variant']}: fitted without {h['budget']:.3g} FLOPs, predicts its best loss "
                   f"{h['predicted']:.4f}{_ci(h['interval'], 4)}, observed {h['observed']:.4f} ({h['error']:+.2%})"
                   + ("" if h["within_interval"] else " — outside the interval") + _frontier_words(h.get("frontier")))
    for label, grids in (section.get("next_grid") or {}).items():
        for g in grids:
            out.append(f"scaling: next grid: {g.get('command') or label + ': ' + g['why']}")
    for c in section["crossings"]:
        where = ("no crossing" if c["budget"] is None else f"cross at {c['budget']:.3g} FLOPs"
                 + (" (extrapolated)" if c["extrapolated"] else ""))
        out.append(f"scaling: {c['first']} vs {c['second']}: {where}; lower at the largest budget: "
                   f"{c['lower_at_largest_budget']}")
    return out
