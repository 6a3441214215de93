"""The README is the truth for users: its table of config groups is the registries' own (no
list of kinds kept by hand), and the mistakes it shows print the lines it shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from llmlab.help import parts_table
from tests.conftest import run_cli

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_the_parts_table_is_the_registries():
    start = README.index("<!-- parts table:")
    table = README[README.index("\n", start) + 1:README.index("<!-- end of parts table -->")]
    assert table == parts_table(), "regenerate it with `python -m llmlab.help` and paste it between the markers"


MISTAKES = re.findall(r"^\$ (llmlab [^\n#]*?)\s*(?:#[^\n]*)?\n(llmlab: error: [^\n]*)$", README, re.M)


def test_the_readme_shows_its_mistakes():
    assert len(MISTAKES) >= 5


@pytest.mark.parametrize("command, line", MISTAKES, ids=[c for c, _ in MISTAKES])
def test_a_mistake_prints_what_the_readme_shows(command, line, tmp_path):
    args = command.split()[1:]
    if "device=cuda" in args and torch.cuda.is_available():
        pytest.skip("this example is for a machine without CUDA")
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip() == line
    assert not (tmp_path / "outputs").exists()  # before any work, no run directory
