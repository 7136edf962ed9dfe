"""Keys other LLaMA-Factory releases accepted, for memfit/interfaces/formats/tables/llamafactory_other_releases.json.

    python tools/llamafactory_release_keys.py GIT_DIR WHEEL... [--check]

GIT_DIR is a clone (or bare mirror) of hiyouga/LLaMA-Factory with its tags (`fetch github:hiyouga/LLaMA-Factory`);
each WHEEL a transformers wheel (`pip download --no-deps transformers==4.45.2`). For every release tag the
dataclass fields its train parser takes are read from the source (`git show`, then the annotated assignments of
ModelArguments, DataArguments, FinetuningArguments, GeneratingArguments, GeneralArguments (0.1.x) and
LLaMA-Factory's own TrainingArguments, with their bases; `init=False` fields are no arguments). Written:

- "keys": a key some release accepted that the pinned release's table (tables/llamafactory.json) lacks, with the
  releases that took it ("LLaMA-Factory 0.1.6 .. 0.7.1");
- "transformers_keys": a TrainingArguments field of a given transformers wheel that the pinned table lacks, with
  the wheels that have it and the LLaMA-Factory releases whose transformers requirement admits those wheels;
- "entry_points": the training scripts each release ships (src/train_bash.py, src/train.py, its launcher).

The hand-written rows (renamed, values, summed, memory, defaults) stay as they are. --check exits 1 when the
file differs from what this would write.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
TABLES = ROOT / "memfit" / "interfaces" / "formats" / "tables"
OUT = TABLES / "llamafactory_other_releases.json"
HPARAMS = re.compile(r"src/(llmtuner|llamafactory)/hparams/[a-z_]+\.py")
ROOTS = ("ModelArguments", "DataArguments", "FinetuningArguments", "GeneratingArguments", "GeneralArguments",
         "TrainingArguments")
ENTRY_POINTS = ("src/train_bash.py", "src/train.py", "src/llamafactory/launcher.py")
TRANSFORMERS_FILES = {"TrainingArguments": "transformers/training_args.py",
                      "Seq2SeqTrainingArguments": "transformers/training_args_seq2seq.py"}


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True).stdout


def releases(git_dir: str) -> list[str]:
    """Every release tag (vX.Y.Z), oldest first."""
    tags = [t for t in _git(git_dir, "tag").split() if re.fullmatch(r"v\d+\.\d+\.\d+", t)]
    return sorted(tags, key=lambda t: Version(t[1:]))


def _is_argument(node: ast.AnnAssign) -> bool:
    """A dataclass field the parser takes: not `field(init=False)`."""
    call = node.value
    return not (isinstance(call, ast.Call) and any(
        k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in call.keywords))


def classes(sources: list[str]) -> dict[str, tuple[set[str], list[str]]]:
    """class name -> (its argument fields, its base names) over the given module sources."""
    out = {}
    for text in sources:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                names = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)
                         and isinstance(n.target, ast.Name) and _is_argument(n)}
                out[node.name] = (names, [ast.unparse(b) for b in node.bases])
    return out


def fields(found: dict, roots) -> set[str]:
    """The fields of `roots` and of their bases defined beside them (bases from other packages add none)."""
    keys: set[str] = set()
    seen: set[str] = set()

    def add(name: str) -> None:
        if name in found and name not in seen:
            seen.add(name)
            names, bases = found[name]
            for base in bases:
                add(base)
            keys.update(names)

    for name in roots:
        add(name)
    return keys


def release_keys(git_dir: str, tag: str) -> set[str]:
    files = [f for f in _git(git_dir, "ls-tree", "-r", "--name-only", tag).split() if HPARAMS.fullmatch(f)]
    return fields(classes([_git(git_dir, "show", f"{tag}:{f}") for f in files]), ROOTS)


def transformers_requirement(git_dir: str, tag: str) -> Requirement | None:
    """The first `transformers...` requirement of the release (requirements.txt, else pyproject.toml)."""
    for path in ("requirements.txt", "pyproject.toml"):
        try:
            text = _git(git_dir, "show", f"{tag}:{path}")
        except subprocess.CalledProcessError:
            continue
        for line in text.splitlines():
            m = re.match(r'\s*"?(transformers[<>=!~][^";]*)', line)
            if m:
                try:
                    return Requirement(m.group(1).strip().rstrip(","))
                except InvalidRequirement:
                    continue
    return None


def wheel_fields(wheel: str) -> tuple[str, set[str]]:
    """(version, TrainingArguments + Seq2SeqTrainingArguments argument fields) of a transformers wheel."""
    version = re.search(r"transformers-([^-]+)-", Path(wheel).name).group(1)
    with zipfile.ZipFile(wheel) as z:
        found = classes([z.read(path).decode() for path in TRANSFORMERS_FILES.values()])
    return version, fields(found, TRANSFORMERS_FILES)


def _span(names: list[str], prefix: str) -> str:
    return f"{prefix} {names[0]}" + (f" .. {names[-1]}" if len(names) > 1 else "")


def derived(git_dir: str, wheels: list[str]) -> dict:
    pinned = json.loads((TABLES / "llamafactory.json").read_text())
    now = {k for cls, keys in pinned.items() if cls != "source" for k in keys}
    tags = releases(git_dir)
    took: dict[str, list[str]] = {}
    entry: dict[str, list[str]] = {}
    for tag in tags:
        for key in release_keys(git_dir, tag) - now:
            took.setdefault(key, []).append(tag[1:])
        listed = set(_git(git_dir, "ls-tree", "-r", "--name-only", tag).split())
        for path in ENTRY_POINTS:
            if path in listed:
                entry.setdefault(path, []).append(tag[1:])
    wheel_keys = sorted((wheel_fields(w) for w in wheels), key=lambda vk: Version(vk[0]))
    required = {tag[1:]: transformers_requirement(git_dir, tag) for tag in tags}
    tf: dict[str, str] = {}
    for key in sorted({k for _, keys in wheel_keys for k in keys} - now):
        versions = [v for v, keys in wheel_keys if key in keys]
        ran = [t for t, req in required.items() if req is not None and any(req.specifier.contains(v) for v in versions)]
        tf[key] = _span(versions, "transformers") + (f" (LLaMA-Factory {ran[0]} .. {ran[-1]} admit it)" if ran else "")
    return {"keys": {k: _span(v, "LLaMA-Factory") for k, v in sorted(took.items())},
            "transformers_keys": tf,
            "entry_points": {p: _span(v, "LLaMA-Factory") for p, v in entry.items()},
            "keys_source": f"tools/llamafactory_release_keys.py over hiyouga/LLaMA-Factory {tags[0]} .. {tags[-1]} "
                           f"(every release tag) and transformers {', '.join(v for v, _ in wheel_keys)} wheels: "
                           f"keys the pinned table ({pinned['source']}) lacks"}


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--check"]
    git_dir, wheels = args[0], args[1:]
    doc = json.loads(OUT.read_text())
    new = dict(doc, **derived(git_dir, wheels))
    if "--check" in argv:
        return 0 if new == doc else 1
    OUT.write_text(json.dumps(new, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
