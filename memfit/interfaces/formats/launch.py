"""A launch: a shell script or one command line, followed to the files and flags that describe the run.

The script is read as the shell would, to the extent a launch needs (launch_shell.py: continuations, quotes,
variables, bash arrays, `cd`, redirections, `;` `&&` `|`). Of its commands the training launch is followed:
`llamafactory-cli train X.yaml [key=value ...]`, `accelerate launch [flags] SCRIPT|-m MODULE ...`,
`deepspeed [flags] SCRIPT ...`, `torchrun [flags] SCRIPT ...`, `trl sft|dpo ...`, `python SCRIPT|-m MODULE ...`;
OpenRLHF's `openrlhf.cli.train_*` commands go to the OpenRLHF reader, LLaMA-Factory's training scripts
(src/train.py, src/train_bash.py, its launcher) to the LLaMA-Factory reader (launch_llamafactory.py). The
launcher's flags give the GPU count and (accelerate) engine settings over its config file; another script's
`--flags` are read as HF / TRL TrainingArguments (launch_script.py). Relative paths resolve from the folder the
script runs in: the script's own folder, changed by its `cd` lines (a launch given as text: the current folder).
The files are merged by launch_merge.py.
"""
from __future__ import annotations

import re
from pathlib import Path

from memfit.interfaces.formats.base import ImportedConfig, WrittenFile, bad, read_text
from memfit.interfaces.formats.launch_merge import merge
from memfit.interfaces.formats.launch_shell import Command, commands_of
from memfit.interfaces.formats.launch_llamafactory import is_llamafactory, llamafactory_part
from memfit.interfaces.formats.launch_script import accelerate_part, script_parts

FORMAT = "launch"
MAX_CHARS = 100_000
PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
# launcher flags that take no value (the rest take one): from accelerate 1.15's launch_command_parser, torch 2.13's
# torch.distributed.run parser and DeepSpeed 0.19's launcher/runner.py (tests/formats/test_launch.py checks them)
ACCELERATE_BOOL = frozenset("cpu debug downcast_bf16 dynamo_use_dynamic dynamo_use_fullgraph "
                            "dynamo_use_regional_compilation enable_cpu_affinity fp8_use_autocast_during_eval module m "
                            "multi_gpu no_python no_tpu_cluster quiet q same_network tpu tpu_cluster tpu_use_sudo "
                            "use_deepspeed use_fsdp use_megatron_lm use_parallelism_config h help".split())
TORCHRUN_BOOL = frozenset("help h module m no_python run_path standalone virtual_local_rank".split())
DEEPSPEED_BOOL = frozenset("module no_python no_local_rank no_ssh no_ssh_check force_multi save_pid bind_cores_to_rank "
                           "quiet q".split())
DEEPSPEED_ALIAS = {"H": "hostfile", "i": "include", "e": "exclude", "num_accelerators": "num_gpus"}
TORCHRUN_ALIAS = {"r": "redirects", "t": "tee"}
TORCH_MODULES = ("torch.distributed.run", "torch.distributed.launch")
FOLLOWS = ("llamafactory-cli train, accelerate launch, deepspeed, torchrun, trl sft|dpo, python SCRIPT|-m MODULE, "
           "OpenRLHF's openrlhf.cli.train_*")


# --- which command is the training launch -------------------------------------------------------------------

def kind_of(argv: list[str]) -> str | None:
    """The launcher a command is (its argv rewritten to start at the launcher's flags), or None."""
    head = Path(argv[0]).name
    if head == "accelerate" and argv[1:2] == ["launch"]:
        return "accelerate"
    if head in ("deepspeed", "torchrun"):
        return head
    if head in ("llamafactory-cli", "lmf") and argv[1:2] == ["train"]:
        return "llamafactory"
    if head == "trl" and argv[1:2] in (["sft"], ["dpo"]):
        return "trl"
    if PYTHON.match(head):
        module = _python_target(argv)[0]
        if module is None:
            return None
        if module in TORCH_MODULES:
            return "torchrun"
        return "accelerate" if module == "accelerate.commands.launch" else "python"
    return None


def _python_target(argv: list[str]) -> tuple[str | None, int]:
    """(module or script, index of its first argument) of a python command; (None, 0) for python -c or a REPL."""
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "-m" and i + 1 < len(argv):
            return argv[i + 1], i + 2
        if argv[i] in ("-c", "-"):
            return None, 0
        i += 2 if argv[i] in ("-W", "-X") else 1
    return (argv[i], i + 1) if i < len(argv) else (None, 0)


def pick(commands: list[Command], where: str) -> Command:
    """The training launch: the one launcher command (accelerate / deepspeed / torchrun / llamafactory-cli train /
    trl), else the one python command; several are an error (one run per estimate)."""
    kinds = [(c, kind_of(c.argv)) for c in commands]
    launches = [c for c, k in kinds if k not in (None, "python")] or [c for c, k in kinds if k == "python"]
    if not launches:
        raise bad(where, None, f"no training launch found; memfit follows {FOLLOWS}")
    if len({(c.line, tuple(c.argv)) for c in launches}) > 1:
        lines = ", ".join(f"line {c.line}: {' '.join(c.argv[:3])}" for c in launches[:4])
        raise bad(where, None, f"{len(launches)} training launches ({lines}); memfit reads one run: put the one to "
                  "check in its own file")
    return launches[0]


# --- launcher flags ----------------------------------------------------------------------------------------

def launcher_flags(argv: list[str], bools: frozenset, where: str, alias: dict | None = None) -> tuple[dict, list[str]]:
    """A launcher's own flags (name with `_` -> value, True for a switch) and the words after them (the script)."""
    flags: dict = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        name, eq, inline = argv[i].lstrip("-").partition("=")
        name = (alias or {}).get(name, name.replace("-", "_"))
        i += 1
        if name in bools:
            flags[name] = True
        elif eq:
            flags[name] = inline
        elif i < len(argv):
            flags[name] = argv[i]
            i += 1
        else:
            raise bad(where, f"--{name}", "expects a value")
    return flags, argv[i + (i < len(argv) and argv[i] == "--"):]


def _count(where: str, flag: str, value) -> int | None:
    if value is None:
        return None
    if not re.fullmatch(r"\d+", str(value)) or int(value) < 1:
        raise bad(where, flag, f"expected a positive number of processes, got {value!r}")
    return int(value)


def _include(value: str) -> int:
    """GPUs of `--include host:0,1@host2:0,1` (a host alone: all its GPUs, unknown here)."""
    hosts = [h.split(":", 1) for h in value.split("@") if h]
    return sum(len([g for g in h[1].split(",") if g]) for h in hosts if len(h) == 2)


def _world(kind: str, flags: dict, env: dict, where: str) -> tuple[dict, str]:
    """GPU count and nodes the launcher gives, and what said it."""
    per_node = nodes = None
    said = ""
    if kind == "torchrun":
        per_node = flags.get("nproc_per_node", "1")
        per_node = None if per_node in ("gpu", "auto", "cpu", "xpu") else _count(where, "--nproc_per_node", per_node)
        nodes = flags.get("nnodes")
        nodes = _count(where, "--nnodes", nodes) if nodes is None or ":" not in str(nodes) else None
        said = "torchrun --nproc_per_node" + (" (default 1)" if "nproc_per_node" not in flags else "")
    elif kind == "deepspeed":
        per_node = _count(where, "--num_gpus", flags.get("num_gpus"))
        visible = env.get("CUDA_VISIBLE_DEVICES")  # DeepSpeed's runner turns it into --include when no flag says more
        include = flags.get("include") or (None if {"num_gpus", "num_nodes", "exclude"} & set(flags)
                                          else visible and f"localhost:{visible}")
        if per_node is None and include and _include(include):
            total = _include(include)
            return {"num_gpus": total, "nodes": include.count("@") + 1}, f"deepspeed --include {include}"
        nodes = _count(where, "--num_nodes", flags.get("num_nodes"))
        said = "deepspeed --num_gpus"
    elif kind == "llamafactory":
        per_node = _count(where, "NPROC_PER_NODE", env.get("NPROC_PER_NODE"))
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if per_node is None and visible and re.fullmatch(r"[\d,]+", visible):
            per_node = len([g for g in visible.split(",") if g])
        nodes = _count(where, "NNODES", env.get("NNODES"))
        said = "NPROC_PER_NODE / CUDA_VISIBLE_DEVICES of llamafactory-cli"
    world = {"num_gpus": per_node * (nodes or 1)} if per_node else {}
    if nodes:
        world["nodes"] = nodes
    return world, said


# --- following a launch to its files ------------------------------------------------------------------------

def follow(cmd: Command, text: str, path: Path | None, where: str, gpus: int | None, readers):
    """The files (ImportedConfig each) the launch uses, the launcher's world, what said it, and notes."""
    kind = kind_of(cmd.argv)
    label = f"{where} line {cmd.line}"
    argv = cmd.argv
    if PYTHON.match(Path(argv[0]).name) and kind in ("torchrun", "accelerate"):
        argv = ["torchrun" if kind == "torchrun" else "accelerate"] + (["launch"] if kind == "accelerate" else []) \
            + argv[_python_target(argv)[1]:]
    origin = "the script's folder and its `cd` lines" if path else "the current folder: a command given as text"
    notes = [f"{label}: the launch followed; paths resolve from {cmd.cwd} ({origin})"]
    if kind == "llamafactory":
        parts, world_notes = llamafactory_part(argv[2:], cmd.cwd, label, gpus)
        world, said = _world(kind, {}, cmd.env, label)
        return parts, world, said, notes + world_notes
    if kind == "trl":
        parts, warns = script_parts(f"trl {argv[1]}", argv[2:], cmd.cwd, label, gpus, readers, variant=argv[1])
        return parts, {}, "", notes + warns
    if kind == "accelerate":
        flags, rest = launcher_flags(argv[2:], ACCELERATE_BOOL, label)
        parts, world_notes = accelerate_part(flags, cmd.cwd, label, gpus)
        target, args = (rest[0], rest[1:]) if rest else ("", [])
        module = bool(flags.get("module") or flags.get("m"))
        more, warns = _target(target, args, text, path, cmd, label, gpus, readers, module=module)
        return parts + more, {}, "", notes + world_notes + warns
    if kind in ("deepspeed", "torchrun"):
        bools, alias = (DEEPSPEED_BOOL, DEEPSPEED_ALIAS) if kind == "deepspeed" else (TORCHRUN_BOOL, TORCHRUN_ALIAS)
        flags, rest = launcher_flags(argv[1:], bools, label, alias)
        world, said = _world(kind, flags, cmd.env, label)
        target, args = (rest[0], rest[1:]) if rest else ("", [])
        module = bool(flags.get("module") or flags.get("m"))
        more, warns = _target(target, args, text, path, cmd, label, gpus, readers, module=module)
        return more, world, said, notes + warns
    script, start = _python_target(argv)
    module = argv[start - 2:start - 1] == ["-m"]
    more, warns = _target(script, argv[start:], text, path, cmd, label, gpus, readers, module=module)
    return more, {"num_gpus": 1}, "python (one process)", notes + warns


def _target(target: str | None, args: list[str], text, path, cmd, label, gpus, readers, module: bool):
    if not target:
        raise bad(label, None, "the launcher names no training script")
    if target.startswith("openrlhf.cli.") or "openrlhf/cli/train_" in target:
        from memfit.interfaces.formats import openrlhf

        return [openrlhf.read(path if path else text, gpus=gpus)], []
    if target == "verl.trainer.main_ppo" or target.endswith("verl/trainer/main_ppo.py"):
        from memfit.interfaces.formats import verl

        return [verl.read(path if path else text, gpus=gpus)], []
    if is_llamafactory(target, args, cmd.cwd):  # its flags are its YAML's keys (launch_llamafactory.py)
        return llamafactory_part(args, cmd.cwd, label, gpus, script=target)
    if module and target.startswith("trl.scripts."):
        variant = target.rsplit(".", 1)[1]
        return script_parts(target, args, cmd.cwd, label, gpus, readers,
                            variant=variant if variant in ("sft", "dpo") else None)
    return script_parts(target, args, cmd.cwd, label, gpus, readers)


def read(path_or_text, *, gpus: int | None = None, readers=None) -> ImportedConfig:
    """`readers`: (read_config, detect_format) for the files the launch names; formats.read_config passes them."""
    text, path = read_text(path_or_text, "launch script")
    where = str(path) if path else "launch command"
    if len(text) > MAX_CHARS:  # shlex is slow on long words; launch scripts are a few KB
        raise bad(where, None, f"{len(text):,} characters is not a launch script (memfit reads up to {MAX_CHARS:,})")
    try:
        cwd = path.resolve().parent if path else Path.cwd()
    except (OSError, ValueError):
        cwd = Path.cwd()
    cmd = pick(commands_of(text, where, cwd), where)
    parts, world, said, notes = follow(cmd, text, path, where, gpus, readers)
    if gpus is not None and world:
        world = {**world, "num_gpus": gpus}
    # "!" a warning, "~" a warning on a memory setting no reader reads (it caps the verdict), else an assumption
    assumed = [n.removeprefix(f"{where} ") for n in notes if not n.startswith(("!", "~"))]  # file_notes names the file
    warnings = [n[1:] for n in notes if n.startswith(("!", "~"))]
    unread = [n[1:] for n in notes if n.startswith("~")]
    if world and said:
        count = world["num_gpus"]
        assumed.append(f"{count} GPU{'s' if count != 1 else ''} from {said}")
    return merge(parts, path=path or Path(where), text=text, world=world, world_from=said or "the launch", assumed=assumed,
                 warnings=warnings, unread=unread)


def read_many(paths, *, gpus: int | None = None, readers=None) -> ImportedConfig:
    """Several files of one run (`--from A --from B`), merged."""
    parts = [readers[0](p, gpus=gpus) for p in paths]
    return merge(parts, path=Path(" + ".join(p.name for p in parts)), assumed=[
        f"{len(paths)} files read as one run: stated values beat defaults; training arguments > accelerate > DeepSpeed"])


def write_files(imported: ImportedConfig, knobs: dict, folder: Path | None = None) -> list[WrittenFile]:
    raise not_written(imported)


def not_written(imported: ImportedConfig):
    from memfit.errors import MemfitError

    files = ", ".join(p.name for p in imported.companions.values())
    return MemfitError(f"{imported.name}: a launch ({files}) is rewritten as a set: `memfit fit` on the launch or "
                       "its --from files (formats/launch_write.py reads it again to find where each value is said)")


__all__ = ["read", "read_many", "commands_of", "pick", "kind_of"]
