"""OpenRLHF's own argparse parser, rebuilt from each released `openrlhf/cli/train_*.py` (the package imports
flash_attn at import time, which needs CUDA, so the parser is built from the source with `ast`), and
get_train_ds_config run from the released source (docs/knobs.md E.3)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import NoReturn

from memfit.interfaces.formats.framework_tables import ValidationFailed, _jsonable


OPENRLHF_VERSIONS = ("0.8.9", "0.9.1", "0.10.1", "0.11.2")
OPENRLHF_SCRIPTS = ("train_sft", "train_dpo", "train_rm", "train_ppo_ray")
WHEEL_CACHE = Path(os.environ.get("MEMFIT_WHEEL_CACHE", Path(tempfile.gettempdir()) / "memfit-wheels"))


def openrlhf_source(version: str, script: str) -> str:
    """The script's source from the released wheel (pip download, no install: the package imports
    flash_attn, which needs CUDA)."""
    return openrlhf_file(version, f"openrlhf/cli/{script}.py")


def openrlhf_file(version: str, path: str) -> str:
    """A file of the released wheel, e.g. openrlhf/utils/deepspeed/deepspeed_utils.py."""
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    wheels = list(WHEEL_CACHE.glob(f"openrlhf-{version}-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"openrlhf=={version}",
                        "-d", str(WHEEL_CACHE)], check=True, capture_output=True, timeout=300)
        wheels = list(WHEEL_CACHE.glob(f"openrlhf-{version}-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        name = next(n for n in z.namelist() if n.endswith(path))
        return z.read(name).decode()


def openrlhf_train_ds_config(source: str, **arguments) -> dict:
    """Run get_train_ds_config of (an edited copy of) OpenRLHF's deepspeed_utils.py: the DeepSpeed config
    it hands to deepspeed.initialize (that module imports only deepspeed, torch and packaging)."""
    namespace: dict = {"__name__": "openrlhf_deepspeed_utils"}
    exec(compile(source, "openrlhf/utils/deepspeed/deepspeed_utils.py", "exec"), namespace)
    return namespace["get_train_ds_config"](**arguments)


def _literal(node, env: dict | None = None):
    try:
        return ast.literal_eval(node)
    except ValueError:
        try:  # int(1e8), f"--{prefix}.optim" inside a loop, and the like
            return eval(compile(ast.Expression(node), "<flag>", "eval"),
                        {"__builtins__": {}, "int": int, "float": float, **(env or {})})
        except Exception:
            return None


def _add_argument_calls(source: str) -> list[tuple[ast.Call, dict]]:
    """Every `parser.add_argument(...)` call, with the names a `for prefix in ("actor", "critic"):` loop around it
    binds (train_ppo_ray >= 0.10.2 declares its per-model optimizer flags in such a loop), once per loop value."""
    out: list[tuple[ast.Call, dict]] = []

    def visit(node, env: dict) -> None:
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            values = _literal(node.iter, env)
            if isinstance(values, (list, tuple)):
                for value in values:
                    for child in node.body:
                        visit(child, {**env, node.target.id: value})
                return
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            out.append((node, env))
        for inner in ast.iter_child_nodes(node):
            visit(inner, env)

    visit(ast.parse(source), {})
    return out


def argparse_table(source: str) -> dict:
    """Every `parser.add_argument(...)` of a script, as plain data: flags -> type, default, action, ..."""
    table = {}
    for node, env in _add_argument_calls(source):
        names = [_literal(a, env) for a in node.args]
        spec: dict[str, object] = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise ValidationFailed(f"add_argument(**{ast.unparse(kw.value)}): memfit reads only named "
                                       "keywords from the source")
            if kw.arg in ("help", "metavar"):
                continue
            if kw.arg == "type":
                spec["type"] = ast.unparse(kw.value)
            else:
                spec[kw.arg] = _jsonable(_literal(kw.value, env))
        spec.setdefault("dest", names[0].lstrip("-").replace("-", "_"))
        for name in names:
            table[name] = spec
    return dict(sorted(table.items()))


def openrlhf_table() -> dict:
    return {"source": "openrlhf " + ", ".join(OPENRLHF_VERSIONS),
            "versions": {v: {s: argparse_table(openrlhf_source(v, s)) for s in OPENRLHF_SCRIPTS}
                         for v in OPENRLHF_VERSIONS}}


def openrlhf_parser(source: str):
    """Run the script's own `add_argument` calls on a fresh parser (no other code of the script runs)."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise ValidationFailed(f"OpenRLHF argparse: {message}")

    parser = Parser(exit_on_error=False)
    from datetime import datetime

    for node, env in _add_argument_calls(source):
        call = ast.Call(func=ast.Name("add_argument", ast.Load()), args=node.args, keywords=node.keywords)
        code = compile(ast.fix_missing_locations(ast.Expression(call)), "<openrlhf>", "eval")
        eval(code, {"add_argument": parser.add_argument, "int": int, "float": float, "str": str,
                    "datetime": datetime, **env})
    return parser


def validate_openrlhf(command_args: list[str], version: str, script: str = "train_sft"):
    """Parse the arguments memfit wrote with OpenRLHF's own parser of that release."""
    parser = openrlhf_parser(openrlhf_source(version, script))
    try:
        return parser.parse_args(command_args)
    except Exception as e:
        raise ValidationFailed(f"OpenRLHF {version} {script}: {e}") from e


