"""Keys other TRL releases' config classes accept, for memfit/interfaces/formats/tables/hf_other_releases.json.

    python tools/trl_release_keys.py GIT_DIR [--check]

GIT_DIR is a clone (or bare mirror) of huggingface/trl with its tags. For the last patch release of every minor
from v0.9 on, the fields of SFTConfig, DPOConfig and ModelConfig are read from the source (`git show`, then the
class's annotated assignments: the dataclass fields its parser accepts). A key some release accepted that the
pinned release's table (tables/hf.json) lacks is written under "keys" with the releases that took it, so a file
written for that release gets a warning naming it instead of a refusal (memfit/interfaces/formats/hf_keys.py).
--check exits 1 when the file differs from what this would write.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLES = ROOT / "memfit" / "interfaces" / "formats" / "tables"
FILES = {"SFTConfig": "trl/trainer/sft_config.py", "DPOConfig": "trl/trainer/dpo_config.py",
         "ModelConfig": "trl/trainer/model_config.py"}
VARIANT = {"SFTConfig": ("sft",), "DPOConfig": ("dpo",), "ModelConfig": ("sft", "dpo")}


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True).stdout


def minors(git_dir: str) -> list[str]:
    """The last patch tag of each minor release from v0.9 (the first with a DPOConfig class)."""
    last: dict[tuple[int, int], tuple[int, str]] = {}
    for tag in _git(git_dir, "tag").split():
        m = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", tag)
        if m and (int(m[1]), int(m[2])) >= (0, 9):
            key, patch = (int(m[1]), int(m[2])), int(m[3])
            if key not in last or patch > last[key][0]:
                last[key] = (patch, tag)
    return [last[k][1] for k in sorted(last)]


def fields(source: str, cls: str) -> set[str]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return set()


def accepted(git_dir: str) -> dict[str, dict[str, list[str]]]:
    """variant -> key -> the tags whose classes accept it."""
    out: dict[str, dict[str, list[str]]] = {"sft": {}, "dpo": {}}
    for tag in minors(git_dir):
        for cls, path in FILES.items():
            try:
                source = _git(git_dir, "show", f"{tag}:{path}")
            except subprocess.CalledProcessError:
                continue
            for key in fields(source, cls):
                for variant in VARIANT[cls]:
                    out[variant].setdefault(key, []).append(tag)
    return out


def other_release_keys(git_dir: str) -> dict:
    current = json.loads((TABLES / "hf.json").read_text())
    now = {"sft": set(current["SFTConfig"]) | set(current["ModelConfig"]),
           "dpo": set(current["DPOConfig"]) | set(current["ModelConfig"])}
    renamed = set(json.loads((TABLES / "hf_other_releases.json").read_text())["renamed"])
    out = {}
    for variant, keys in accepted(git_dir).items():
        gone = {k: tags for k, tags in keys.items() if k not in now[variant] and k not in renamed}
        out[variant] = {k: f"TRL {tags[0].lstrip('v')}" + (f" .. {tags[-1].lstrip('v')}" if len(tags) > 1 else "")
                        for k, tags in sorted(gone.items())}
    return out


def main(argv: list[str]) -> int:
    git_dir, check = argv[0], "--check" in argv
    path = TABLES / "hf_other_releases.json"
    doc = json.loads(path.read_text())
    tags = minors(git_dir)
    new = dict(doc, keys=other_release_keys(git_dir),
               keys_source=f"tools/trl_release_keys.py over huggingface/trl {tags[0]} .. {tags[-1]} (last patch of "
                           "each minor): SFTConfig / DPOConfig / ModelConfig fields the pinned table lacks")
    if check:
        return 0 if new == doc else 1
    path.write_text(json.dumps(new, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
