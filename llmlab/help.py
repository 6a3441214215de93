"""``llmlab <command> --help``: the command's own config groups, each option with one line on
what it is and its settings' defaults, and the command's settings with their comments."""

from __future__ import annotations

from pathlib import Path

from llmlab.paths import conf_dir

def command_help(command: str, config_dirs: tuple[str, ...] = ()) -> str:
    """A command's ``--help``: its own config groups, each option with its one-line description
    (a registered part's docstring, a preset's first comment), and its own settings with their
    defaults and comments. Hydra's help lists every group, which the other commands reject.
    ``config_dirs``: those given with ``--config-dir``, whose options are listed too."""
    import yaml

    from llmlab.registry import Registry, defaults_text

    text = (conf_dir() / f"{command}.yaml").read_text()
    doc = yaml.safe_load(text) or {}
    help_cfg = (doc.get("hydra") or {}).get("help") or {}
    groups = command_groups(command)
    out = [help_cfg.get("header", f"llmlab {command}\n").rstrip("\n"), ""]
    about = [line[1:].strip() for line in text.splitlines()[1:] if line.startswith("#")]  # the first is the header's
    if about:
        out += [*about, ""]
    if groups:
        out += ["== Config groups (group=option) =="]
        for sub in groups:
            options = group_listing(sub, config_dirs)[0]
            out.append(f"{sub}: {', '.join(options)}")
            for o in options:
                registry = Registry.by_group.get(sub)
                out.append(f"  {o:<14} {_option_line(sub, o, registry, config_dirs)}".rstrip())
                settings = defaults_text(registry.config_of(o), registry.kind_key) if registry and o in registry else ""
                if settings:
                    out.append(f"  {'':<14}   {settings}")
        out.append("")
    from llmlab.commands import command_of

    out += ["== Settings (key=value) ==", *command_of(command).settings_help(), ""]
    out.append(help_cfg.get("footer", "").rstrip("\n"))
    return "\n".join(out).rstrip("\n") + "\n"


def command_groups(command: str) -> list[str]:
    """The config groups a command composes, as its YAML's defaults list picks them, each
    followed by its subgroups (``model``, ``model/attention``, ``model/ffn``), then the groups
    declared with their registries (`llmlab.registry.declared_groups`)."""
    import yaml

    from llmlab.commands import command_of

    doc = yaml.safe_load((conf_dir() / f"{command}.yaml").read_text()) or {}
    groups = []
    for entry in doc.get("defaults") or []:
        if isinstance(entry, dict):
            for key in entry:
                group = str(key).split("@")[0].lstrip("/")
                if not str(key).startswith("override"):
                    groups += [group] + [f"{group}/{sub}" for sub in group_listing(group)[1]]
    return groups + [registry.group for registry in command_of(command).groups]


def group_listing(group: str, config_dirs: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """A config group's options and subgroups, from where llmlab's configs are: the YAML files
    under conf/ (and under each of ``config_dirs``, given with ``--config-dir``) and Hydra's
    ConfigStore (its public ``list``). Hydra's config loader answers the same, but copies its
    whole config repository for each question (about 25 ms each, some 30 questions for
    ``llmlab train --help``)."""
    from llmlab.registry import config_store

    options, subgroups = set(), set()
    for root in (conf_dir(), *map(Path, config_dirs)):
        folder = root / group
        for path in folder.iterdir() if folder.is_dir() else ():
            if path.is_dir():
                subgroups.add(path.name)
            elif path.suffix == ".yaml":
                options.add(path.stem)
    try:
        stored = config_store().list(group)
    except OSError:  # no option of this group is stored
        stored = []
    for name in stored:
        (options.add(name[:-5]) if name.endswith(".yaml") else subgroups.add(name))
    return sorted(options), sorted(subgroups)


def _option_line(group: str, option: str, registry, config_dirs: tuple[str, ...] = ()) -> str:
    """One option's description: a registered part's docstring, else its YAML's first comment
    (the YAML Hydra picks: llmlab's own before one of the same name in a ``--config-dir``)."""
    from llmlab.registry import Registry, first_sentence

    if registry is not None and option in registry:
        return registry.describe(option)
    for root in (conf_dir(), *map(Path, config_dirs)):
        path = root / group / f"{option}.yaml"
        if path.is_file():
            comment = [line[1:].strip() for line in path.read_text(errors="replace").splitlines()
                       if line.startswith("#") and not line[1:].strip().startswith("@")]
            return first_sentence("\n".join(comment))
    attention = Registry.by_group.get("model/attention")
    if group == "model" and attention is not None and option in attention:
        return f"the tiny model with {option} attention (attention.* settings)"
    return ""


def parts_table() -> str:
    """The table in docs/parts.md of config groups, their options and their settings, written from the
    registries and conf/ (so no list of kinds is kept by hand): ``python -m llmlab.help``."""
    import dataclasses

    from llmlab.commands import command_of
    from llmlab.registry import Registry

    command_of("train")  # its groups' registries (what `llmlab.cli.register_parts` does)
    Registry.load_all()
    rows = ["| group | options | settings |", "| --- | --- | --- |"]
    for group in command_groups("train"):
        options = group_listing(group)[0]
        registry = Registry.by_group.get(group)
        if registry is None:  # the model presets: sizes under model.*
            from llmlab.model.config import ModelConfig
            settings = [f"`model.{f.name}`" for f in dataclasses.fields(ModelConfig)]
        else:
            prefix = (registry.package or group).removeprefix("_global_.")
            kinds: dict[str, list[str]] = {}
            for name in registry.names():
                for f in dataclasses.fields(registry.config_of(name)):
                    if f.name != registry.kind_key:
                        kinds.setdefault(f.name, []).append(name)
            settings = [f"`{prefix}.{key}`" + ("" if len(names) == len(registry.names()) else f" ({', '.join(names)})")
                        for key, names in kinds.items()]
        rows.append(f"| `{group}` | {', '.join(f'`{o}`' for o in options)} | {', '.join(settings)} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(parts_table())
