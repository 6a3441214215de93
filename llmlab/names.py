"""How runs are named: a sweep job's directory (`path_slug`) and a report's label
(`compact_override`) write a sweep's expansion of a large round number short (``1e12``, not
``1000000000000.0``), so a swept value and a typed one read alike. The CLI names directories
with these and the report reads them back, so they sit below both."""

from __future__ import annotations

import re


def compact_number(m: re.Match) -> str:
    """``100000000.0`` -> ``1e8``, ``3000000`` -> ``3e6``: a budget keeps its digits in a name."""
    plain = m.group(0)[:-2] if m.group(0).endswith(".0") else m.group(0)
    value = float(plain)
    if value >= 1e6:
        mantissa, exponent = f"{value:e}".split("e")
        short = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
        return short if len(short) < len(plain) else plain
    return plain


def compact_override(override: str) -> str:
    """``train.max_flops=1000000000000.0`` (a sweep's expansion of ``1e12``) -> ``train.max_flops=1e12``:
    how a report labels a run, so a swept value and a typed one read (and group) alike."""
    key, sep, value = override.partition("=")
    return key + sep + re.sub(r"^\d+(\.0)?$", compact_number, value) if sep else override


def path_slug(text: str, limit: int = 120) -> str:
    """A short, path-safe form of a job's overrides for its sweep directory name; large round
    numbers in their short form (``train.max_flops=1e8``). ``limit`` leaves room for four swept
    keys (variant, size, budget, seed: about 75 characters) within a file name's 255."""
    text = re.sub(r"(?<==)\d+(\.0)?(?=,|_|$)", compact_number, str(text))
    text = re.sub(r"[^A-Za-z0-9._=,+-]+", "-", text.replace("/", "-"))
    text = re.sub(r"-{2,}", "-", text).strip("-")
    return text[:limit].rstrip("-,") or "defaults"
