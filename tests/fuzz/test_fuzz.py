"""A fixed-seed slice of the input fuzzer (`tests.fuzz.cases`): five cases of each family, every
one judged by the oracle; ``make fuzz N=2000`` runs a random seed and prints the table."""

from __future__ import annotations

from tests.conftest import run_cli
from tests.fuzz.cases import FAMILIES, family_of, record, run_cases, table

SEED = 20261126
PER_FAMILY = 5


def slice_indices(seed: int, per_family: int) -> list[int]:
    picked: dict[str, list[int]] = {f: [] for f in FAMILIES}
    i = 0
    while any(len(v) < per_family for v in picked.values()):
        family = family_of(seed, i)
        if len(picked[family]) < per_family:
            picked[family].append(i)
        i += 1
    return sorted(i for v in picked.values() for i in v)


def test_a_fixed_slice_of_fuzzed_inputs_meets_the_oracle(tmp_path):
    """No traceback, no refusal longer than one line, no payload run, nothing outside the
    case's folder changed, no older checkpoint changed, no hang, no silent fallback."""
    verdicts = run_cases(SEED, slice_indices(SEED, PER_FAMILY), tmp_path, run_cli)
    rows = [record(v) for v in verdicts]
    defects = [f"case {r['index']} ({r['family']}: {r['what']}; llmlab {' '.join(r['command'])}) -> "
               f"{r['outcome']}: {r['detail']}" for r in rows if r["outcome"] not in ("ok", "refused")]
    assert not defects, "\n".join(defects) + "\n" + table(rows)
    assert {r["family"] for r in rows} == set(FAMILIES) and len(rows) == PER_FAMILY * len(FAMILIES)
    # the slice exercises both ends: some cases run to the end, some are refused
    assert {"ok", "refused"} <= {r["outcome"] for r in rows}
