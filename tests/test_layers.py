"""The layers of memfit, read from the imports: each goes only downward, the checkers (trace, measure) read the
facts and never the estimate's decisions, and no module imports itself back through others."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "memfit"
ORDER = ("foundation", "facts", "memory", "roles", "planner", "interfaces")
FOUNDATION = {"memfit", "memfit.errors", "memfit.dtypes", "memfit.breakdown"}
# may import: a layer imports its own and lower layers; the checkers only the foundation, the facts and each other
ALLOWED = {layer: set(ORDER[: i + 1]) for i, layer in enumerate(ORDER)}
ALLOWED["checkers"] = {"foundation", "facts", "checkers"}
ALLOWED["interfaces"] |= {"checkers"}  # the command line runs the trace and the measurement


def layer_of(module: str) -> str:
    if module in FOUNDATION:
        return "foundation"
    part = module.split(".")[1]
    if part in ("trace", "measure", "monitor"):
        return "checkers"
    return part


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path, package: str) -> set[str]:
    """memfit modules a file imports, at module level or inside functions (a `from pkg import name` counts
    the submodule `pkg.name` when there is one)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("memfit")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("memfit"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if _exists(sub) else node.module)
    return out


def _exists(module: str) -> bool:
    path = ROOT.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    return {module_name(p): imports(p, module_name(p)) for p in root.rglob("*.py")}


def upward_edges(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in edges.items() for b in targets
                  if layer_of(b) not in ALLOWED[layer_of(a)])


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_imports_only_go_down():
    assert upward_edges(graph()) == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_checks_catch_an_upward_import_and_a_cycle():
    edges = {"memfit.memory.a": {"memfit.planner.b"}, "memfit.planner.b": {"memfit.memory.a"},
             "memfit.trace.x": {"memfit.roles.y"}, "memfit.roles.y": set()}
    assert upward_edges(edges) == [("memfit.memory.a", "memfit.planner.b"), ("memfit.trace.x", "memfit.roles.y")]
    assert cycles(edges) == [["memfit.memory.a", "memfit.planner.b"]]


def test_no_module_is_over_450_lines():
    long = {module_name(p): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450}
    assert long == {}
