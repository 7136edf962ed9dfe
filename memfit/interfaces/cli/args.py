"""Command-line arguments from the knob table, and the Scenario they describe.

Every knob of memfit/facts/data/knobs.toml is a flag `--name-with-dashes` (plus its aliases), grouped as the
table groups them; `scenario_from_args` reads them back by the same names. Commands add only their own
options (--json, --top, ...).
"""
from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from memfit.errors import MemfitError
from memfit.facts.knobs import Knob, hardware, inputs, knobs

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "p": 1e15, "pb": 1e15, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
GROUPS = {"run": "run", "hardware": "hardware", "training": "training", "engine": "engine",
          "several": "preference / RL (several models; OpenRLHF legacy and dotted flags in the help texts)"}


class Parser(argparse.ArgumentParser):
    """argparse with memfit's errors: one line (main() prints it after "memfit: error:", so the program's name is
    not repeated), a close spelling for a misspelled option or command."""

    def error(self, message: str):  # argparse's multi-line usage dump -> one line, exit 2
        raise MemfitError(_with_suggestion(message))

    def parse_args(self, args=None, namespace=None):
        ns, extras = self.parse_known_args(args, namespace)
        if extras:  # the chosen subcommand's options are the ones a misspelling was meant to be
            self.error(unrecognized(self._chosen(ns), extras))
        return ns

    def _chosen(self, ns: argparse.Namespace) -> argparse.ArgumentParser:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = getattr(ns, action.dest, None)
                return self if chosen is None else action.choices.get(chosen, self)
        return self


def close_to(word: str, candidates) -> str | None:
    import difflib

    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """Arguments no option of `parser` takes, in one line: each unknown option with the closest real one."""
    options = [o for o in parser._option_string_actions if o.startswith("--")]
    flags = [x.split("=", 1)[0] for x in extras if x.startswith("-") and x != "-"]
    if not flags:
        return f"unexpected argument{'s' * (len(extras) > 1)}: {' '.join(extras)} (see `{parser.prog} --help`)"
    hints = [f"did you mean {m}?" if len(flags) == 1 else f"{f}: did you mean {m}?"
             for f in flags if (m := close_to(f, options))]
    return (f"unknown option{'s' * (len(flags) > 1)} {', '.join(flags)}"
            + (f"; {'; '.join(hints)}" if hints else f" (see `{parser.prog} --help`)"))


_INVALID_CHOICE = re.compile(r"^argument (\S+): invalid choice: '(.*)' \(choose from (.*)\)$")


def _with_suggestion(message: str) -> str:
    """argparse's "invalid choice" (a subcommand) with the closest choice named first."""
    m = _INVALID_CHOICE.match(message)
    if not m:
        return message
    what, given = ("command", m.group(2)) if m.group(1) == "command" else (m.group(1), m.group(2))
    choices = [c.strip().strip("'") for c in m.group(3).split(",")]
    near = close_to(given.lower(), choices)
    return f"unknown {what} {given!r}" + (f"; did you mean {near}?" if near else "") + f" (one of: {', '.join(choices)})"


def case_free(values) -> Callable[[str], str]:
    """An argparse type: a value matched to its choice whatever its case (`--tuning Lora` is lora); anything else
    is passed on unchanged for the knob's own check to name what would be valid."""
    table = {str(v).lower(): str(v) for v in values}

    def value(text: str) -> str:
        return table.get(text.lower(), text)

    return value


def parse_size(text: str, what: str) -> int:
    """'24GiB', '80GB', '1.4TB', '512MiB' or plain bytes -> bytes (GB = 1e9, GiB = 2^30)."""
    m = _SIZE.match(str(text))
    unit = (m.group(2) or "").lower() if m else None
    if not m or unit not in _UNITS:
        raise MemfitError(f"{what} {text!r} is not a size; write e.g. 24GiB, 80GB or 1.4TB")
    number = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(number):  # 1e400 digits: float says inf, int() cannot hold it
        raise MemfitError(f"{what} {text!r} is not a size; write e.g. 24GiB, 80GB or 1.4TB")
    value = int(number)
    if value <= 0:
        raise MemfitError(f"{what} must be positive, got {text!r}")
    return value


def whole_number(text: str) -> int:
    """An integer as people write it: 4, -1, 5e8 (a whole number); 2.5 is refused."""
    try:
        value = float(text) if re.fullmatch(r"-?[0-9.]+(e[0-9]+)?", text, re.I) else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not math.isfinite(value) or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(value)


def positive_int(text: str) -> int:
    value = whole_number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add(group, k: Knob, positional: bool = False) -> None:
    if positional:
        group.add_argument(k.name, nargs="?", help=k.help)
        return
    choices = f" (one of: {', '.join(map(str, k.choices))})" if k.choices else ""
    options: dict = {"dest": k.name, "help": k.help + choices, "default": None}
    if k.type == "bool":
        options["action"] = argparse.BooleanOptionalAction
    elif k.type == "int":
        options["type"] = whole_number
    elif k.type == "float":
        options["type"] = float
    elif k.type == "str" and (k.choices or k.name == "profile"):
        options["type"] = case_free(k.choices or _profiles())
    if k.const is not None:
        options |= {"nargs": "?", "const": k.const}
    if k.name == "from_file":  # several files of one run: --from A --from B (formats/launch_merge.py)
        options |= {"action": "append", "metavar": "FILE",
                    "help": k.help + "; a launch script or command line is followed to its files; repeat --from "
                                     "for several files of one run"}
    if k.name == "framework_version":  # several releases of one run: --framework-version A --framework-version B
        options |= {"action": "append", "metavar": "NAME=VERSION|LOCKFILE"}
    group.add_argument(k.flag, *k.aliases, **options)


def _profiles() -> tuple[str, ...]:
    from memfit.facts.frameworks import frameworks

    return tuple(frameworks())


def add_scenario_arguments(p: argparse.ArgumentParser) -> None:
    """The model, the machine and every knob, as flags."""
    groups = {name: p.add_argument_group(title) for name, title in GROUPS.items()}
    for name, k in inputs().items():
        _add(groups[k.group], k, positional=name == "model")
    for k in (*hardware().values(), *knobs().values()):
        _add(groups[k.group], k)


def add_hardware_arguments(p: argparse.ArgumentParser) -> None:
    """The machine alone (commands whose knobs come from a file)."""
    group = p.add_argument_group(GROUPS["hardware"])
    for k in hardware().values():
        _add(group, k)


def _pairs(k: Knob, text: str) -> dict:
    try:
        return {name.strip(): int(n) for name, n in (x.split("=") for x in text.split(","))}
    except ValueError:
        raise MemfitError(f"{k.label} {text!r}: write name=N pairs, e.g. actor=4,critic=2") from None


def knobs_from_args(a: argparse.Namespace) -> dict:
    """The knobs the user said on the command line (None = not said)."""
    out = {}
    for name, k in knobs().items():
        value = getattr(a, name, None)
        if value is not None and k.type == "list":
            value = tuple(x.strip() for x in value.split(","))
        elif value is not None and k.type == "pairs":
            value = _pairs(k, value)
        out[name] = value
    if out.get("checkpoint_every_n") and not out.get("checkpointing"):
        out["checkpointing"] = "every_n"
    return out


def hardware_from_args(a: argparse.Namespace):
    from memfit.facts.catalog import custom_gpu, find_gpu
    from memfit.facts.scenario import Hardware
    from memfit.interfaces.machine import load_runtime

    table = hardware()
    named = find_gpu(a.gpu) if a.gpu else None
    if a.gpu_mem:
        gpu = custom_gpu(parse_size(a.gpu_mem, table["gpu_mem"].label), like=named)
    elif named is not None:
        gpu = named
    else:
        raise MemfitError("say which GPU: --gpu NAME (see `memfit gpus`) or --gpu-mem 24GiB")
    host = parse_size(a.host_ram, table["host_ram"].label) if a.host_ram else None
    return Hardware(gpu=gpu, host_ram=host, runtime=load_runtime(getattr(a, "machine", None)),
                    gpus_per_node=_count(a, table["gpus_per_node"]), nodes=_count(a, table["nodes"]))


def _count(a: argparse.Namespace, k: Knob) -> int:
    """A whole-number hardware flag as given, else its knob's default."""
    value = getattr(a, k.name)
    value = k.default if value is None else value
    if not isinstance(value, int):
        raise MemfitError(f"{k.flag} must be a whole number; got {value!r}")
    return value


def scenario_from_args(a: argparse.Namespace):
    return scenario_and_file(a)[0]


def scenario_and_file(a: argparse.Namespace, hw=None):
    """The Scenario, the file it was read from (`--from`; None without one) and the notes on that file: what its
    readers assumed or warned about, which also go into the scenario's "assumed" (the printed output and --json
    carry them)."""
    from dataclasses import replace

    from memfit.facts.assumptions import from_source
    from memfit.facts.catalog import find_model
    from memfit.facts.profiles import build_scenario
    from memfit.interfaces.lockfiles import framework_versions

    notes: list[str] = []
    if hw is None:
        hw, notes = hardware_for_file(a) if a.from_file else (hardware_from_args(a), [])
    given = knobs_from_args(a)
    typed = {k for k, v in given.items() if v is not None}  # a typed flag that does nothing is an error
    profile, model, imported = a.profile, a.model, None
    if a.from_file:
        from memfit.interfaces.formats import read_configs

        imported = read_configs(a.from_file, gpus=hw.world_size)
        given = imported.knobs | {k: v for k, v in given.items() if v is not None}
        profile = profile or imported.profile
        model = model or imported.model_name
    if not model:
        raise MemfitError("say which model: a hub id or alias (see `memfit models`), or a file naming one with --from")
    from memfit.interfaces.cli.progress import progress

    with progress(f"looking up {model} (the catalog, then the Hugging Face cache and hub)", a):
        spec = find_model(model)
    s = build_scenario(spec, hw, given, profile or "hf-trainer", typed=typed,
                       versions=framework_versions(getattr(a, "framework_version", None)))
    if imported is not None:
        unread = file_unread(imported, host=hw.host_ram is not None)
        # an unread setting is printed once, as the estimate's "not read" line (it caps the verdict there)
        notes = [n for n in dict.fromkeys(notes + file_notes(imported)) if n not in unread]
        s = replace(s, assumed=s.assumed + tuple(from_source(notes, "config")), unread=tuple(unread))
    return s, imported, notes


def hardware_for_file(a: argparse.Namespace):
    """The machine of a run read from a file, and a note when it differs from the file: --gpus / --nodes when
    typed (they win, as `accelerate launch --num_processes` does), else the GPU count the file states
    (accelerate's num_processes / num_machines, an OpenRLHF launcher's --num_gpus, a DeepSpeed batch triangle)."""
    from dataclasses import replace

    from memfit.interfaces.formats import read_configs

    hw = hardware_from_args(a)
    stated = read_configs(a.from_file).world
    total, nodes = stated.get("num_gpus"), stated.get("nodes") or 1
    if total is None:
        return hw, []
    typed = a.gpus_per_node is not None or a.nodes is not None
    if not typed:
        if total % nodes:
            raise MemfitError(f"{_names(a.from_file)}: {total} GPUs do not split over {nodes} nodes; say --gpus and --nodes")
        return replace(hw, gpus_per_node=total // nodes, nodes=nodes), [
            f"{total} GPUs{f' on {nodes} nodes' if nodes > 1 else ''} as the file says (--gpus / --nodes to change)"]
    if total != hw.world_size:
        return hw, [f"the file says {total} GPUs, the command line {hw.world_size}: the command line's count is used "
                    "(the launcher's own flag wins the same way)"]
    return hw, []


def _names(files) -> str:
    """The --from file(s) as an error names them (one file: as before)."""
    return str(files) if isinstance(files, str) else " + ".join(map(str, files))


def file_notes(imported) -> list[str]:
    """What a file's readers (and those of the files it names) assumed or warned about."""
    out = [f"{imported.name}: {note}" for note in imported.assumed] + list(imported.warnings)
    for companion in imported.companions.values():
        out += file_notes(companion)
    return out


def file_unread(imported, host: bool) -> list[str]:
    """The memory settings of a file (and of the files it names) that no reader reads and that can raise memory:
    each caps the run's verdict at "tight" (Scenario.unread); those on host RAM alone only when `host` RAM is
    judged (--host-ram)."""
    out = list(imported.unread) + (list(imported.unread_host) if host else [])
    for companion in imported.companions.values():
        out += file_unread(companion, host)
    return list(dict.fromkeys(out))


def blank_arguments() -> dict:
    """Every scenario argument unset, so a file's own knobs (and its framework's defaults) decide."""
    return {name: None for name in (*inputs(), *hardware(), *knobs())}


def add_length_arguments(p: argparse.ArgumentParser) -> None:
    """--brief / --detail: how much of a long (several-model) output to print; the answer and the next steps always."""
    length = p.add_mutually_exclusive_group()
    length.add_argument("--brief", action="store_true",
                        help="only the answer, a line per role (GPUs, peak GiB, when) and what to do next")
    length.add_argument("--detail", action="store_true",
                        help="everything: the summary first, then every table and assumption (the default)")
