"""Exporters (``llmlab export format=<name>``): a checkpoint in another library's layout."""

from llmlab.export.hf import export_hf

FORMATS = {"hf": export_hf}
