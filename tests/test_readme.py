"""The README and docs/ are the truth for users: the table of config groups in docs/parts.md is
the registries' own (no list of kinds kept by hand), the mistakes they show print the lines they
show, and every link between them leads to a file and a heading that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from llmlab.help import parts_table
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = {p.relative_to(ROOT).as_posix(): p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
README = PAGES["README.md"]


def test_the_readme_is_short_and_the_reference_is_in_docs():
    assert len(README.splitlines()) <= 400
    assert len(PAGES) - 1 >= 4
    for name in PAGES:
        if name != "README.md":
            assert f"]({name})" in README, f"the README links no {name}"


def test_the_parts_table_is_the_registries():
    parts = PAGES["docs/parts.md"]
    start = parts.index("<!-- parts table:")
    table = parts[parts.index("\n", start) + 1:parts.index("<!-- end of parts table -->")]
    assert table == parts_table(), "regenerate it with `python -m llmlab.help` and paste it between the markers"


def anchor(heading: str) -> str:
    """The anchor a code host gives a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_pages_leads_somewhere():
    broken = []
    for name, text in PAGES.items():
        here = (ROOT / name).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, fragment = target.partition("#")
            file = (here / path).resolve() if path else ROOT / name
            if not file.exists():
                broken.append(f"{name}: {target} (no such file)")
            elif fragment and file.suffix == ".md":
                headings = {anchor(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)}
                if fragment not in headings:
                    broken.append(f"{name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


MISTAKES = [m for text in PAGES.values()
            for m in re.findall(r"^\$ (llmlab [^\n#]*?)\s*(?:#[^\n]*)?\n(llmlab: error: [^\n]*)$", text, re.M)]


def test_the_pages_show_their_mistakes():
    assert len(MISTAKES) >= 5


@pytest.mark.parametrize("command, line", MISTAKES, ids=[c for c, _ in MISTAKES])
def test_a_mistake_prints_what_the_pages_show(command, line, tmp_path):
    args = command.split()[1:]
    if "device=cuda" in args and torch.cuda.is_available():
        pytest.skip("this example is for a machine without CUDA")
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip() == line
    assert not (tmp_path / "outputs").exists()  # before any work, no run directory
