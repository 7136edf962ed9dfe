"""The `python3 -m verl.trainer.main_ppo ...` command of a shell script (or a command line alone), as verl receives it:
the script's shell read by launch_shell.py (continuations, quotes, `VAR=...` / `export`, `${VAR:-default}`, bash
arrays and "${ARRAY[@]}", comments), then Hydra's own command-line options (`--config-path` / `-cp`,
`--config-name` / `-cn`) split from the overrides. The script's own arguments (`$@`) are read as none."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from memfit.interfaces.formats.base import bad
from memfit.interfaces.formats.launch_shell import commands_of

MODULE = "verl.trainer.main_ppo"
SCRIPT_FILE = "verl/trainer/main_ppo.py"
_OPTIONS = {"--config-path": "config_path", "-cp": "config_path", "--config-name": "config_name",
            "-cn": "config_name", "--config-dir": "config_dir", "-cd": "config_dir"}
_ARGUMENTS = ("$@", "$*", "${@}", "${*}")
_BRANCH = re.compile(r"(?m)^[ \t]*(case|if|elif)\b")


@dataclass
class Launch:
    words: list[str]  # the Hydra overrides, in order
    line: int  # the script line the command starts on
    cwd: Path
    options: dict = field(default_factory=dict)  # config_path / config_name / config_dir
    notes: list[str] = field(default_factory=list)


def is_verl(text: str) -> bool:
    return MODULE in text or SCRIPT_FILE in text


def _start(argv: list[str]) -> int | None:
    """The index of the first argument after main_ppo in a command's words, or None."""
    for i, word in enumerate(argv):
        if word == MODULE and i and argv[i - 1] == "-m":
            return i + 1
        if word.endswith(SCRIPT_FILE):
            return i + 1
    return None


def find_launch(text: str, where: str, cwd: Path) -> Launch:
    """The one main_ppo command of the script; none, or more than one, is a one-line error."""
    found = [(c, _start(c.argv)) for c in commands_of(text, where, cwd)]
    found = [(c, i) for c, i in found if i is not None]
    if not found:
        raise bad(where, None, f"no `python3 -m {MODULE}` command in the script (memfit reads verl's PPO / GRPO "
                  "trainer launches)")
    if len(found) > 1:
        lines = ", ".join(str(c.line) for c, _ in found)
        raise bad(where, None, f"{len(found)} verl launches (lines {lines}); memfit reads one: keep one per script")
    command, start = found[0]
    launch = Launch([], command.line, command.cwd)
    branches = _BRANCH.search(text[:text.find(MODULE)] if MODULE in text else text)
    if branches:  # verl's examples pick GPU or NPU settings in `case "${DEVICE}"`: memfit runs no condition
        line = text[:branches.start()].count("\n") + 1
        launch.notes.append(f"{where}: line {line}: `{branches.group(1)}` branches are read in order, each assignment "
                            "in them taken (memfit runs no condition): check the values above are the ones your "
                            "machine's branch sets")
    words = command.argv[start:]
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, inline = word.partition("=")
        if word == "":  # "${EXTRA[@]}" of an empty array: bash passes no word
            pass
        elif word in _ARGUMENTS:
            launch.notes.append(f"{where}: line {command.line}: the script's own arguments ({word}) read as none")
        elif name in _OPTIONS:
            if not eq and i + 1 >= len(words):
                raise bad(where, name, "expects a value")
            launch.options[_OPTIONS[name]] = inline if eq else words[i + 1]
            i += 0 if eq else 1
        elif word.startswith("-"):
            raise bad(where, word, f"{MODULE} takes Hydra overrides (key=value) and --config-path / --config-name; "
                      "memfit does not read this option")
        else:
            launch.words.append(word)
        i += 1
    return launch
