"""Where each value of a launch comes from, for `memfit fit` to change it there.

launch.py reads a launch into one merged record; this module reads it again keeping the provenance: for every
file-or-command-line piece (a Source) the part its reader made, the file on disk it comes from (if any) and, per
key of that part's document, the command-line word that states it (a `--flag` of the training script or of
`accelerate launch`, a `key=value` override of `llamafactory-cli train`). A value given on the command line wins
over the file it overrides, so that is the word an edit changes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from memfit.errors import MemfitError
from memfit.interfaces.formats.base import ImportedConfig, read_text

ACCELERATE_SECTIONS = ("deepspeed_config", "fsdp_config")


@dataclass
class Script:
    """A launch script (or command line) and the command of it that launches the training."""

    path: Path  # `memfit fit` rewrites files: a launch it follows is read from one (read_launch)
    text: str
    first: int  # first line (1-based) of the launch command
    last: int  # its last physical line (continuations included)
    target: str  # the training script or module, as typed (launcher flags come before it, script flags after)
    cwd: Path | None = None  # the folder the command runs in (its `cd` lines), where its relative paths resolve


class OwnFlags(Protocol):
    """A script's own flags that say knobs themselves (launch_dschat.Flags)."""

    @property
    def says(self) -> frozenset[str]: ...

    def changes(self, knobs: dict) -> dict: ...


@dataclass
class Source:
    part: ImportedConfig  # as the launch read it (the command line's values merged over the file)
    file: Path | None  # the file on disk the part's document comes from (None: the command line alone)
    flags: dict = field(default_factory=dict)  # key path (tuple) -> flag as typed (`per_device_train_batch_size`)
    style: str = "--"  # "--" (`--flag value`) or "=" (`key=value`, LLaMA-Factory's overrides)
    where: str = "after"  # the flags' side of the target word: "before" (launcher's) or "after" (the script's)
    script: Script | None = None
    appendable: bool = False  # a key no word states may be added as a new `--flag` (no file beside the words)
    own: OwnFlags | None = None  # a script's own flags that say knobs (launch_dschat.Flags), not a format's keys

    @property
    def direct(self) -> bool:
        """The part is the file as it is on disk: its writer's output is the new file."""
        return self.file is not None and not self.flags and self.part.text == _disk(self.file)


@dataclass
class Launch:
    inputs: list[Path]  # what the user gave (`memfit fit X` or --from ...)
    sources: list[Source]
    scripts: list[Script]

    @property
    def name(self) -> str:
        return " + ".join(p.name for p in self.inputs)

    def files(self) -> set[Path]:
        """Every file on disk the launch reads."""
        out = {s.path for s in self.scripts}
        for src in self.sources:
            out |= {p for p in _paths(src.part) if _disk(p) is not None}
            if src.file is not None:
                out.add(src.file)
        return {Path(p) for p in out}


def _disk(path) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None


def _paths(part: ImportedConfig) -> list[Path]:
    return ([part.path] if part.path else []) + [p for c in part.companions.values() for p in _paths(c)]


def read_launch(paths, gpus: int | None) -> Launch:
    """The sources of every input: a launch script is followed; any other file is one source."""
    from memfit.interfaces.formats import detect_format, read_config

    sources: list[Source] = []
    scripts: list[Script] = []
    inputs = [Path(p) for p in paths]
    for path in inputs:
        if not path.is_file():
            raise MemfitError(f"{path}: memfit fit rewrites files; save the command line in a script and fit that")
        text = read_text(path, "config")[0]
        if detect_format(text, path.name) == "launch":
            script, found = _script_sources(path, text, gpus)
            scripts.append(script)
            sources += found
        else:
            part = read_config(path, gpus=gpus)
            sources.append(Source(part, path))
    return Launch(inputs, _once(sources), scripts)


def _once(sources: list[Source]) -> list[Source]:
    """A file given twice, or given and named by another part (its DeepSpeed JSON), is one source."""
    def key(p):
        return Path(p).resolve()

    named = {key(p) for s in sources for c in s.part.companions.values() for p in _paths(c)}
    out, seen = [], set()
    for s in sources:
        k = key(s.file) if s.direct else None
        if k is not None and (k in named or k in seen):
            continue
        seen.add(k)
        out.append(s)
    return out


def _script_sources(path: Path, text: str, gpus) -> tuple[Script, list[Source]]:
    from memfit.interfaces.formats import launch as L
    from memfit.interfaces.formats import launch_shell as S

    cwd = path.resolve().parent
    cmd = L.pick(S.commands_of(text, str(path), cwd), str(path))
    kind = L.kind_of(cmd.argv)
    argv = cmd.argv
    if L.PYTHON.match(Path(argv[0]).name) and kind in ("torchrun", "accelerate"):
        argv = ["torchrun" if kind == "torchrun" else "accelerate"] + (["launch"] if kind == "accelerate" else []) \
            + argv[L._python_target(argv)[1]:]
    later = [start for start, _ in S.logical_lines(text, str(path)) if start > cmd.line]
    last = later[0] - 1 if later else len(text.split("\n"))
    label = f"{path} line {cmd.line}"
    if kind == "llamafactory":
        script = Script(path, text, cmd.line, last, argv[1], cmd.cwd)
        return script, [_llamafactory(argv[2:], cmd.cwd, label, gpus, script)]
    if kind == "trl":
        script = Script(path, text, cmd.line, last, argv[1], cmd.cwd)
        return script, _script_flags(f"trl {argv[1]}", argv[2:], cmd.cwd, label, gpus, script, variant=argv[1])
    sources: list[Source] = []
    if kind == "accelerate":
        flags, rest = L.launcher_flags(argv[2:], L.ACCELERATE_BOOL, label)
        sources += _accelerate(flags, cmd.cwd, label, gpus)
    elif kind in ("deepspeed", "torchrun"):
        ds = kind == "deepspeed"
        bools, alias = (L.DEEPSPEED_BOOL, L.DEEPSPEED_ALIAS) if ds else (L.TORCHRUN_BOOL, L.TORCHRUN_ALIAS)
        rest = L.launcher_flags(argv[1:], bools, label, alias)[1]
    else:
        target, start = L._python_target(argv)
        rest = argv[start - 1:] if target else []
    if rest and rest[0] in ("-m", "--module"):
        rest = rest[1:]
    if not rest:
        raise MemfitError(f"{label}: the launcher names no training script")
    script = Script(path, text, cmd.line, last, rest[0], cmd.cwd)
    for s in sources:
        s.script = script
    from memfit.interfaces.formats.launch_llamafactory import is_llamafactory

    if is_llamafactory(rest[0], rest[1:], cmd.cwd):  # LLaMA-Factory's own script: its flags are its YAML's keys
        return script, sources + [_llamafactory(rest[1:], cmd.cwd, label, gpus, script, rest[0])]
    from memfit.interfaces.formats import launch_dschat
    from memfit.interfaces.formats.launch_script import flags_of

    if launch_dschat.matches(rest[0], flags_of(rest[1:])[0]):  # DeepSpeed-Chat's main.py: no TrainingArguments
        return script, sources + [_dschat(rest[0], rest[1:], cmd.cwd, label, gpus, script)]
    variant = rest[0].rsplit(".", 1)[1] if rest[0].startswith("trl.scripts.") else None
    return script, sources + _script_flags(rest[0], rest[1:], cmd.cwd, label, gpus, script,
                                           variant=variant if variant in ("sft", "dpo") else None)


def _llamafactory(args: list[str], cwd: Path, label: str, gpus, script: Script, target: str | None = None) -> Source:
    """`target`: LLaMA-Factory's training script the words follow (None: `llamafactory-cli train`)."""
    from memfit.interfaces.formats.launch_llamafactory import llamafactory_part
    from memfit.interfaces.formats.launch_script import resolve

    part = llamafactory_part(args, cwd, label, gpus, script=target)[0][0]
    if args and args[0].endswith((".yaml", ".yml", ".json")):
        flags = {(w.lstrip("-").partition("=")[0],): w.lstrip("-").partition("=")[0] for w in args[1:]}
        return Source(part, resolve(args[0], cwd, label, "llamafactory-cli train"), flags, "=", script=script)
    from memfit.interfaces.formats.launch_script import flags_of

    flags = {(k,): k for k in flags_of(args)[0]}
    return Source(part, None, flags, "--", script=script, appendable=True)


def _dschat(target: str, args: list[str], cwd: Path, label: str, gpus, script: Script) -> Source:
    """main.py's flags: one source whose knobs are written back as those flags (launch_dschat.Flags)."""
    from memfit.interfaces.formats import launch_dschat
    from memfit.interfaces.formats.launch_script import flags_of, script_parts

    flags = flags_of(args)[0]
    part = script_parts(target, args, cwd, label, gpus, _readers())[0][0]
    own = launch_dschat.Flags(launch_dschat.values(flags, label), label)
    return Source(part, None, {(k,): k for k in flags}, "--", script=script, appendable=True, own=own)


def _accelerate(flags: dict, cwd: Path, label: str, gpus) -> list[Source]:
    from memfit.interfaces.formats.launch_script import ACCELERATE_DS, ACCELERATE_TOP, accelerate_part, resolve

    parts = accelerate_part(flags, cwd, label, gpus)[0]
    if not parts:
        return []
    config = flags.get("config_file")
    file = resolve(config, cwd, label, "--config_file") if config is not None else None
    said: dict[tuple[str, ...], str] = {(ACCELERATE_TOP[f],): f for f in flags if f in ACCELERATE_TOP}
    said |= {("deepspeed_config", f): f for f in flags if f in ACCELERATE_DS}
    said |= {("fsdp_config", f): f for f in flags if f.startswith("fsdp_")}
    for f in ("use_deepspeed", "use_fsdp", "multi_gpu"):
        if f in flags:
            said[("distributed_type",)] = f"!{f}"  # a switch that names the engine: not a value to rewrite
    return [Source(parts[0], file, said, "--", "before", appendable=file is None)]


def launcher_flag(path: tuple) -> str | None:
    """The `accelerate launch` flag that sets a key of its config (None: the launcher has none)."""
    from memfit.interfaces.formats.launch_script import ACCELERATE_DS, ACCELERATE_TOP

    if len(path) == 1:
        return next((f for f, key in ACCELERATE_TOP.items() if key == path[0]), None)
    if len(path) == 2 and (path[0], path[1] in ACCELERATE_DS) == ("deepspeed_config", True):
        return path[1]
    return path[1] if len(path) == 2 and path[0] == "fsdp_config" and path[1].startswith("fsdp_") else None


def _script_flags(target: str, args: list[str], cwd: Path, label: str, gpus, script: Script,
                  variant: str | None = None) -> list[Source]:
    """The training script's flags over the config file they name (one source), and the other files they name."""
    from memfit.interfaces.formats.launch_script import flags_of, resolve, script_parts

    readers = _readers()
    parts, _ = script_parts(target, args, cwd, label, gpus, readers, variant=variant)
    flags, words = flags_of(args)
    config = flags.get("config")
    if config is None and words and str(words[0]).endswith((".yaml", ".yml", ".json")):
        config = words[0]
    config_path = resolve(config, cwd, label, "--config") if config is not None else None
    said = {}
    for k, v in flags.items():
        if k.startswith("no_") and v is True:
            said[(k[3:],)] = f"!{k}"  # HfArgumentParser's --no_X: a word memfit will not rewrite
        said[(k,)] = k
    out = []
    for part in parts:
        if part.format == "hf" and (part.path is None or not _same(part.path, config_path) or said
                                    or part.text != _disk(part.path)):
            file = config_path if config_path is not None and _same(part.path, config_path) else None
            out.append(Source(part, file, said, "--", script=script, appendable=file is None))
        else:
            out.append(Source(part, part.path))
    return out


def _same(a, b) -> bool:
    try:
        return a is not None and b is not None and Path(a).resolve() == Path(b).resolve()
    except (OSError, ValueError):
        return False


def _readers():
    from memfit.interfaces.formats import detect_format, read_config

    return read_config, detect_format


def region(script: Script, where: str) -> tuple[int, int]:
    """Character offsets in script.text of the launch command's words on one side of its target word."""
    lines = script.text.split("\n")
    start = sum(len(x) + 1 for x in lines[:script.first - 1])
    end = start + sum(len(x) + 1 for x in lines[script.first - 1:script.last]) - 1
    m = re.search(rf"(?<![^\s=]){re.escape(script.target)}(?![^\s;&|])", script.text[start:end])
    if m is None:
        return start, end
    return (start, start + m.start()) if where == "before" else (start + m.end(), end)
