"""Exporters (``llmlab export format=<name>``): a checkpoint in another library's layout.
The names are known without importing the exporters (torch with them), so a mistyped format
is one line before torch loads."""

FORMATS = ("hf",)


def exporter(name: str):
    """The function that writes format ``name``: ``(ckpt, model, out, overwrite) -> dict``."""
    if name == "hf":
        from llmlab.export.hf import export_hf
        return export_hf
    raise KeyError(name)
