"""Derive memfit/interfaces/formats/tables/axolotl.json from axolotl's own pydantic schema, without installing it.

axolotl pins its own torch, so it cannot be installed beside memfit's; its config schema is plain pydantic classes
whose fields are class-level annotations, so reading the source with `ast` gives each key's type and default.

    python tools/axolotl_table.py /path/to/axolotl/checkout   # a git checkout (or a bare mirror: --git DIR)

Keys: every annotated field of AxolotlInputConfig and its base classes (src/axolotl/utils/schemas/*.py), and the
fields of each plugin's args model (src/axolotl/integrations/*/args.py: the keys a `plugins:` entry adds).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT_CLASS = "AxolotlInputConfig"
SCHEMAS = "src/axolotl/utils/schemas/"
PLUGINS = "src/axolotl/integrations/"
SCALARS = {"bool": "bool", "int": "int", "float": "float", "str": "str"}


def _git_files(git_dir: str, commit: str) -> dict[str, str]:
    names = subprocess.run(["git", f"--git-dir={git_dir}", "ls-tree", "-r", "--name-only", commit],
                           check=True, capture_output=True, text=True).stdout.split()
    wanted = [n for n in names if n.endswith(".py") and (n.startswith(SCHEMAS) or
                                                         (n.startswith(PLUGINS) and n.endswith("/args.py")))]
    return {n: subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{n}"], check=True,
                              capture_output=True, text=True).stdout for n in wanted}


def _classes(sources: dict[str, str]) -> tuple[dict, dict]:
    """name -> (bases, [(field, annotation node, value node)]), and enum name -> its string values."""
    classes, enums = {}, {}
    for text in sources.values():
        for node in ast.parse(text).body:
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [ast.unparse(b) for b in node.bases]
            if any("Enum" in b for b in bases):
                enums[node.name] = [s.value.value for s in node.body if isinstance(s, ast.Assign)
                                    and isinstance(s.value, ast.Constant)]
                continue
            fields = [(s.target.id, s.annotation, s.value) for s in node.body
                      if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                      and not s.target.id.startswith("_") and s.target.id != "model_config"]
            classes[node.name] = (bases, fields)
    return classes, enums


def _kind(node, classes: dict, enums: dict) -> dict:
    """An annotation -> {"type": ..., "choices": [...]} as framework_tables._kind writes it."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | None | Y
        parts = []
        stack = [node]
        while stack:
            n = stack.pop()
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr):
                stack += [n.right, n.left]
            elif not (isinstance(n, ast.Constant) and n.value is None):
                parts.append(_kind(n, classes, enums))
        kinds = {p["type"] for p in parts}
        if len(parts) == 1:
            return parts[0]
        if kinds == {"int", "float"}:
            return {"type": "float"}
        if kinds == {"str"} and all("choices" in p for p in parts):
            return {"type": "str", "choices": [c for p in parts for c in p["choices"]]}
        return {"type": "any"}
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value)
        if head in ("Annotated",):
            return _kind(node.slice.elts[0], classes, enums)
        if head in ("Optional",):
            return _kind(node.slice, classes, enums)
        if head == "Literal":
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            values = [i.value for i in items if isinstance(i, ast.Constant)]
            if all(isinstance(v, str) for v in values):
                return {"type": "str", "choices": values}
            if all(isinstance(v, bool) for v in values):
                return {"type": "bool"}
            return {"type": "any"}
        if head in ("list", "List", "tuple"):
            return {"type": "list"}
        if head in ("dict", "Dict"):
            return {"type": "dict"}
        return {"type": "any"}
    name = ast.unparse(node)
    if name in SCALARS:
        return {"type": SCALARS[name]}
    if name in enums:
        return {"type": "str", "choices": enums[name]}
    if name in classes:
        return {"type": "dict"}
    if name in ("list", "dict"):
        return {"type": name}
    return {"type": "any"}


def _default(value):
    """The literal default of `= x` or `= Field(default=x)` / `Field(x)`; None when absent or not a literal."""
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "Field":
        kw = {k.arg: k.value for k in value.keywords}
        value = kw.get("default", value.args[0] if value.args else None)
    if value is None:
        return None
    try:
        return ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError):
        return None


def _fields(name: str, classes: dict, enums: dict, seen: set) -> dict:
    """Fields of `name` and its bases; a subclass's field wins over a base's (Python's MRO, roughly)."""
    if name not in classes or name in seen:
        return {}
    seen.add(name)
    bases, fields = classes[name]
    out = {}
    for base in reversed(bases):
        out.update(_fields(base, classes, enums, seen))
    for field, annotation, value in fields:
        spec = {**_kind(annotation, classes, enums), "default": _default(value)}
        alias = _alias(value)
        out[alias or field] = spec
        if alias and alias != field:  # populate_by_name: the field's own name is accepted too
            out[field] = dict(spec, alias_of=alias)
    return out


def _alias(value) -> str | None:
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "Field":
        kw = {k.arg: k.value for k in value.keywords}
        if isinstance(kw.get("alias"), ast.Constant):
            return kw["alias"].value
    return None


def derive(sources: dict[str, str], source: str) -> dict:
    classes, enums = _classes(sources)
    keys = _fields(ROOT_CLASS, classes, enums, set())
    plugins = {}
    for path, text in sorted(sources.items()):
        if not path.startswith(PLUGINS):
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef) and node.name in classes and classes[node.name][1]:
                plugins.setdefault(path.split("/")[3], {}).update(_fields(node.name, classes, enums, set()))
    return {"source": source, "keys": dict(sorted(keys.items())),
            "plugins": {p: dict(sorted(v.items())) for p, v in sorted(plugins.items())}}


def main(argv: list[str]) -> None:
    git_dir, commit = argv[0], argv[1] if len(argv) > 1 else "HEAD"
    sha = subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", commit], check=True, capture_output=True,
                         text=True).stdout.strip()
    version = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{sha}:VERSION"], capture_output=True,
                             text=True).stdout.strip()
    table = derive(_git_files(git_dir, sha), f"axolotl {version} (github:axolotl-ai-cloud/axolotl@{sha}), "
                   f"{SCHEMAS} {ROOT_CLASS} and {PLUGINS}*/args.py, read with tools/axolotl_table.py")
    out = Path(__file__).resolve().parents[1] / "memfit/interfaces/formats/tables/axolotl.json"
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{out}: {len(table['keys'])} keys, {len(table['plugins'])} plugins")


if __name__ == "__main__":
    main(sys.argv[1:])
