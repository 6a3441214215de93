"""Where llmlab's own files are."""

from __future__ import annotations

from pathlib import Path


def conf_dir() -> Path:
    """conf/ ships inside the package as llmlab/conf; in a source checkout it is ../conf."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "train.yaml").is_file():
            return candidate
    raise RuntimeError("llmlab's conf/ directory is missing from this installation")
