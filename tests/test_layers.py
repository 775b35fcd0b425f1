"""The packages of `src/llds` form layers that only point down (docs/architecture.md).

Every import statement of every module is parsed, including imports inside functions and under
TYPE_CHECKING: a lazy import is still a dependency a reader has to follow.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "llds"

# The layer of each top-level package or module of llds; an import may point to its own
# package or to a lower layer, never up. The table is the one in docs/architecture.md.
LAYERS = {
    "errors": 0,
    "metrics": 0,
    "configs": 0,
    "lazy": 0,
    "io": 1,
    "config": 1,
    "logs": 1,
    "algo": 2,
    "retrieval": 2,
    "models": 2,
    "runs": 2,
    "env": 3,
    "data": 4,
    "rollout": 4,
    "monitor": 5,
    "policy": 5,
    "evaluation": 6,
    "probe": 7,
    "sft": 8,
    "train": 8,
    "analysis": 8,
    "report": 9,
    "integrations": 9,
    "demo": 10,
    "commands": 11,
    "cli": 12,
}


def unit_of(module: str) -> str:
    """`llds.train.trainer` -> `train`; `llds` itself -> `llds`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path) -> list[str]:
    """Every `llds...` module that `path` imports, with relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "llds"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "llds":
                continue
            if target == "llds":  # `from llds import metrics` names a module of llds
                found += [f"llds.{a.name}" for a in node.names if not a.name.startswith("__")]
            else:
                found.append(target)
    return found


def package_graph() -> dict[str, dict[str, list[str]]]:
    """unit -> imported unit -> the `module -> target` lines behind the edge."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(SRC.rglob("*.py")):
        source = unit_of(module_name(path))
        for target in imported_modules(path):
            dest = unit_of(target)
            if dest not in (source, "llds"):
                graph[source][dest].append(f"{module_name(path)} -> {target}")
    return graph


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b": ["x"]}, "b": {"c": ["y"]}, "c": {"a": ["z"]}, "d": {"a": ["w"]}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b": ["x"]}, "b": {}}) == []


def test_relative_and_package_imports_are_resolved(tmp_path, monkeypatch):
    pkg = tmp_path / "llds" / "train"
    pkg.mkdir(parents=True)
    mod = pkg / "x.py"
    mod.write_text(
        "from . import y\nfrom ..monitor import alarms\nfrom llds import metrics\n"
        "def f():\n    import llds.report.html\n"
    )
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path / "llds")
    assert imported_modules(mod) == [
        "llds.train",
        "llds.monitor",
        "llds.metrics",
        "llds.report.html",
    ]


def test_every_package_has_a_layer():
    units = {unit_of(module_name(p)) for p in SRC.rglob("*.py")} - {"llds"}
    assert units - set(LAYERS) == set(), "add the new package to LAYERS and the architecture doc"


def test_no_import_cycle_between_packages():
    found = cycles(package_graph())
    assert found == [], f"import cycles between packages of llds: {found}"


@pytest.mark.parametrize("source", sorted(LAYERS))
def test_imports_point_down(source):
    upward = [
        line
        for dest, lines in package_graph().get(source, {}).items()
        if LAYERS[dest] >= LAYERS[source]
        for line in lines
    ]
    assert upward == [], f"{source} (layer {LAYERS[source]}) imports sideways or up: {upward}"


def test_architecture_doc_lists_every_layer():
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [name for name in LAYERS if f"`llds.{name}`" not in doc]
    assert missing == [], f"docs/architecture.md does not place {missing}"
