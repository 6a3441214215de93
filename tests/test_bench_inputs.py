"""The benchmarks read files a person may have edited: each mistake stops with one line that
names the file and the entry, before any run starts."""

import json

import pytest

from bench.isoflop import read_grids


def test_a_grids_file_is_keyed_as_the_study_asks(tmp_path):
    path = tmp_path / "grids.json"
    path.write_text(json.dumps({"mha": {"5e+11": [32, 48], "1000000000000": [40, 64], "2e12": [8]}, "gqa": {}}))
    assert read_grids(path, ["mha"], [5e11, 1e12]) == {"mha": {"5e+11": [32, 48], "1e+12": [40, 64]}}


@pytest.mark.parametrize("text, names", [
    ("{not json", "file"),
    ("[1, 2]", "JSON object"),
    ('{"mla": {"5e11": [32]}}', "variant 'mha'"),
    ('{"mha": [32]}', "variant 'mha'"),
    ('{"mha": {"five": [32]}}', "budget 'five'"),
    ('{"mha": {"1e12": [32]}}', "budget 5e+11"),
    ('{"mha": {"5e11": []}}', "budget 5e+11"),
    ('{"mha": {"5e11": [32, "48"]}}', "budget 5e+11"),
    ('{"mha": {"5e11": [32, true]}}', "budget 5e+11"),
    ('{"mha": {"5e11": [0]}}', "budget 5e+11"),
])
def test_a_hand_edited_grids_file_stops_with_one_line(tmp_path, text, names):
    path = tmp_path / "grids.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as stop:
        read_grids(path, ["mha"], [5e11])
    message = str(stop.value)
    assert message.startswith(f"bench.isoflop: {path}: ") and "\n" not in message
    assert names in message
