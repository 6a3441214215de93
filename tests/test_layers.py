"""The package's layers, read from its imports (module-level and inside functions alike): a
module imports only from its own layer or below, never across packages of one layer, and no
two modules import each other, directly or around a circle."""

from __future__ import annotations

import ast
from pathlib import Path

import llmlab

ROOT = Path(llmlab.__file__).resolve().parent

# lowest first; a package or top-level module named here, the rest of its dotted path free
LAYERS = [
    {"llmlab", "errors", "paths"},
    {"console"},  # below files: a file written in place of a link says so through it
    {"names", "files", "perf", "registry"},
    {"data", "model"},
    {"sample", "export"},
    {"eval"},
    {"study"},  # reads runs (eval.runs) and draws with eval.plots
    {"train"},
    {"commands"},
    {"help", "overrides", "hydra_files"},
    {"mistakes"},  # every mistake of the command line in words
    {"preflight"},  # the Hydra callback that checks every job before any directory
    {"cli"},
    {"__main__"},
]


def module_names() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports_of(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The llmlab modules ``path`` imports (``from llmlab.x import y`` counts y where y is a module)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package this module is in
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if not base.startswith("llmlab"):
                continue
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("llmlab"))
    return {m for m in found if m in known and m != name}


def unit(name: str) -> str:
    """The layer entry a module belongs to: ``llmlab.train.loop`` -> ``train``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer(name: str) -> int:
    for i, members in enumerate(LAYERS):
        if unit(name) in members:
            return i
    raise AssertionError(f"{name} is in no layer; add its package to LAYERS")


def graph() -> dict[str, set[str]]:
    known = module_names()
    return {name: imports_of(path, name, known) for name, path in known.items()}


def test_every_import_goes_down_or_stays_in_its_package():
    wrong = []
    for name, targets in graph().items():
        for target in targets:
            if layer(target) > layer(name) or (layer(target) == layer(name) and unit(target) != unit(name)
                                               and unit(target) != "llmlab"):
                wrong.append(f"{name} -> {target}")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_no_import_circles():
    edges = graph()
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan: a strongly connected set of more than one module is a circle
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_the_reader_sees_a_planted_circle_and_a_climb(tmp_path):
    """The checks above read real imports: a module pair that imports each other, and a
    model module importing training, are both seen."""
    known = {"llmlab.model.a": tmp_path / "a.py", "llmlab.model.b": tmp_path / "b.py", "llmlab.train.loop": None}
    (tmp_path / "a.py").write_text("from llmlab.model import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from llmlab.model.a import x\n    import llmlab.train.loop\n")
    assert imports_of(tmp_path / "a.py", "llmlab.model.a", known) == {"llmlab.model.b"}
    assert imports_of(tmp_path / "b.py", "llmlab.model.b", known) == {"llmlab.model.a", "llmlab.train.loop"}
    assert layer("llmlab.train.loop") > layer("llmlab.model.b")


def test_no_class_sets_more_than_twenty_attributes():
    """A class that holds everything (the trainer once set 51) is split into declared parts."""
    crowded = []
    for name, path in module_names().items():
        for cls in [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)]:
            attrs = {node.attr for node in ast.walk(cls) if isinstance(node, ast.Attribute)
                     and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) and node.value.id == "self"}
            if len(attrs) > 20:
                crowded.append(f"{name}.{cls.name}: {len(attrs)}")
    assert crowded == []


def test_every_package_ships():
    """pyproject.toml lists llmlab's packages by name: one left out is missing from a wheel
    (a new family's package, say), though the tests pass on the source tree."""
    import tomllib

    listed = set(tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.relative_to(ROOT.parent).parent.parts) for p in ROOT.rglob("__init__.py")}
    assert found - listed == set()
