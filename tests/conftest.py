import functools
import inspect
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

from memfit.facts.catalog import find_gpu, find_model
from memfit.facts.profiles import build_scenario
from memfit.facts.scenario import Hardware

# the benches' modules (shared_cases, published, ...) for the tests that check them
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
# a machine profile of the developer's own (memfit calibrate --save) would change every estimate: none is read
os.environ.pop("MEMFIT_MACHINE", None)
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="memfit-tests-config-")  # chromium writes there too


@pytest.fixture
def scenario():
    """Build a Scenario the way the CLI does: model and GPU by name, knobs as the user says them."""

    def make(model="qwen2-7b-instruct", gpu="rtx4090", gpus=1, profile="hf-trainer", host_ram=None, **knobs):
        hw = Hardware(gpu=find_gpu(gpu), gpus_per_node=gpus, host_ram=host_ram)
        return build_scenario(find_model(model), hw, knobs, profile)

    return make


# ---- tiers (issue 32 item 5): `-m core` needs no optional package, `-m extras` needs one, `-m slow` re-traces live
# or runs a real engine. Every item gets exactly one tier; plain `pytest` runs all three.
OPTIONAL = frozenset({"torch", "transformers", "peft", "deepspeed", "trl", "accelerate", "fastapi", "uvicorn",
                      "starlette", "httpx", "lightning", "pyarrow", "datasets", "tokenizers", "huggingface_hub",
                      "fitcheck", "jinja2", "safetensors", "torchtune", "litgpt", "playwright"})
# live re-traces and real engine / process-group runs, by module (tests/...)
SLOW = frozenset({
    "measure/test_accelerate_fsdp.py", "measure/test_dpo_engine.py", "measure/test_moe_zero3.py",
    "measure/test_zero3_offload.py", "measure/test_zero3_param_offload.py",
    "trace/test_trace.py", "trace/test_dpo_trace.py", "trace/test_any_config.py", "trace/test_peft_methods.py",
    "trace/test_trainable_tokens.py", "trace/test_frozen_fp32.py", "trace/test_glm4.py", "trace/test_qwen1.py",
    "trace/test_litgpt.py", "trace/test_torchtune.py", "trace/test_torchtune_distributed.py", "trace/test_derive.py",
    "trace/test_release_logps.py", "trace/test_verl_workers.py", "plan/test_traffic.py",
    "bench/test_litgpt_distributed.py", "monitor/test_gloo_ranks.py", "lengths/test_real_run.py",
})
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _optional(name: str) -> set[str]:
    return {name.split(".")[0]} & OPTIONAL


@functools.cache
def _local_file(name: str, near: Path) -> Path | None:
    """The repository's own file for an absolute import (memfit.x, tests.x, or a helper on the tests' path)."""
    parts = name.split(".")
    bases = [ROOT] if parts[0] in ("memfit", "tests") else [near, TESTS, ROOT / "bench"]
    for base in bases:
        for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    return None


def _imports(nodes, near: Path):
    """(module names imported or importorskip'd, names bound by `from local import name`) in these nodes."""
    import ast

    names, bound = [], {}
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names if _local_file(f"{node.module}.{a.name}", near)]
            bound.update({a.asname or a.name: (node.module, a.name) for a in node.names})
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip" and node.args
              and isinstance(node.args[0], ast.Constant)):
            names.append(node.args[0].value)
    return names, bound


@functools.cache
def _parsed(path: Path):
    import ast

    tree = ast.parse(path.read_text(), str(path))
    defs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    top = [n for stmt in tree.body if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
           for n in ast.walk(stmt)]
    return defs, _imports(top, path.parent)


_TOP_IMPORT = re.compile(r"^(?:import\s+([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*)"
                         r"|from\s+([\w.]+)\s+import\s+(?:\(([^)]*)\)|([^\n#]*)))", re.M)


@functools.cache
def _top_imports(path: Path) -> tuple[str, ...]:
    """The modules a file imports at its top (column 0; importorskip calls included), read without parsing it."""
    if TESTS in path.parents:
        return tuple(_parsed(path)[1][0])
    names = []
    for plain, module, wrapped, imported in _TOP_IMPORT.findall(path.read_text()):
        names += [n.strip() for n in plain.split(",") if n.strip()]
        if module:
            names += [module] + [f"{module}.{n.split()[0]}" for n in (wrapped or imported).split(",") if n.strip()]
    return tuple(names)


@functools.cache
def _module_edges(path: Path) -> tuple[frozenset, frozenset]:
    """(optional packages a file imports at its top, the local files it imports there)."""
    names = _top_imports(path)
    local = {_local_file(name, path.parent) for name in names} - {None, path}
    return frozenset().union(*map(_optional, names)), frozenset(local)


@functools.cache
def _module_needs(path: Path) -> frozenset:
    """Optional packages a module imports when it is imported: its top-level imports, through local modules."""
    needs, todo, seen = set(), [path], {path}
    while todo:
        direct, local = _module_edges(todo.pop())
        needs |= direct
        todo += local - seen
        seen |= local
    return frozenset(needs)


_BODY_IMPORT = re.compile(r"^[ \t]+(?:import\s+([\w.]+)|from\s+([\w.]+)\s+import)", re.M)


@functools.cache
def _memfit_function_needs(path: Path, name: str) -> frozenset:
    """What one of memfit's own functions imports in its body (read by text: memfit is not parsed)."""
    text = path.read_text()
    start = re.search(rf"^def {re.escape(name)}\(", text, re.M)
    if not start:
        return frozenset()
    end = re.compile(r"^\S", re.M).search(text, start.end())
    body = text[start.end():end.start() if end else len(text)]
    needs = set()
    for plain, module in _BODY_IMPORT.findall(body):
        needs |= _optional(plain or module)
        if local := _local_file(plain or module, path.parent):
            needs |= _module_needs(local)
    return frozenset(needs)


@functools.cache
def _function_edges(path: Path, name: str) -> tuple[frozenset, tuple]:
    """(optional packages a function's body imports, the (file, function)s it names: its module's, or one of a
    local module, `f` or `module.f`; its arguments' fixtures in its module)."""
    import ast

    defs, (_, bound) = _parsed(path)
    if name not in defs:
        return frozenset(), ()
    body = list(ast.walk(defs[name]))
    names, local_bound = _imports(body, path.parent)
    bound = bound | local_bound
    needs = set().union(*map(_optional, names))
    for module in names:
        if local := _local_file(module, path.parent):
            needs |= _module_needs(local)
    edges = set()
    used = {n.id for n in body if isinstance(n, ast.Name)} | {a.arg for a in defs[name].args.args}
    for used_name in used:
        if used_name in defs:
            edges.add((path, used_name))
        elif used_name in bound and (local := _local_file(bound[used_name][0], path.parent)):
            edges.add((local, bound[used_name][1]))
    for node in body:  # module.f(...), the module imported by name
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            if local := _local_file(".".join(bound[node.value.id]), path.parent):
                edges.add((local, node.attr))
    return frozenset(needs), tuple(sorted(edges))


@functools.cache
def _function_needs(path: Path, name: str) -> frozenset:
    """Optional packages a function imports when it runs: in its body and the functions it names, transitively
    through the tests' own modules; a memfit function counts for the imports in its own body only (memfit imports
    its extras lazily, where they are used: following its calls further would make every CLI test an extra)."""
    needs, todo, seen = set(), [(path, name)], {(path, name)}
    while todo:
        node = todo.pop()
        if ROOT / "memfit" in node[0].parents:
            needs |= _memfit_function_needs(*node)
            continue
        direct, edges = _function_edges(*node)
        needs |= direct
        for edge in edges:
            if edge not in seen:
                seen.add(edge)
                todo.append(edge)
    return frozenset(needs)


def _item_needs(item) -> frozenset:
    path = Path(str(item.path)).resolve()
    needs = set(_module_needs(path))
    function = getattr(item, "function", None)
    if function is not None:
        needs |= _function_needs(path, function.__name__)
    for fixture in getattr(item, "fixturenames", ()):
        for fixturedef in item.session._fixturemanager.getfixturedefs(fixture, item) or ():
            func = getattr(fixturedef.func, "__wrapped__", fixturedef.func)
            source = Path(inspect.getsourcefile(func) or "").resolve()
            if source.is_file() and ROOT in source.parents:
                needs |= _function_needs(source, func.__name__)
    return frozenset(needs)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.path)).resolve()
        where = path.relative_to(TESTS).as_posix() if TESTS in path.parents else None
        if item.get_closest_marker("extras"):  # a module that says so: it needs a framework's own venv (verl's)
            continue
        tier = "slow" if where in SLOW else "extras" if _item_needs(item) else "core"
        item.add_marker(getattr(pytest.mark, tier))
