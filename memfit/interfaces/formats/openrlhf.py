"""OpenRLHF command lines (`deepspeed --module openrlhf.cli.train_sft ...`, in a script or alone).

Flags changed names twice; the flag table of each release (tables/openrlhf.json, rebuilt from the
released `openrlhf/cli/train_*.py` by validate_openrlhf.openrlhf_table) says which are valid where:

| table  | releases      | precision / attention flags                       |
| ------ | ------------- | ------------------------------------------------- |
| 0.8.9  | <= 0.8.9      | `--bf16`, `--flash_attn` (absent: eager)           |
| 0.9.1  | 0.8.10-0.9.1  | `--bf16`, `--attn_implementation`                  |
| 0.10.1 | 0.9.2-0.10.1  | `--param_dtype`, `--attn_implementation`           |
| 0.11.2 | >= 0.10.2     | dotted: `--ds.param_dtype`, `--ds.attn_implementation`, `--train.micro_batch_size` ... |

The release is detected from the flags present (the newest table that knows them all) and the
command is written back in the same style. OpenRLHF builds its DeepSpeed config in code
(`get_train_ds_config`): optimizer offload only by `--adam_offload` with pin_memory true, buckets
"auto" (= DeepSpeed defaults), overlap_comm left to DeepSpeed unless `--overlap_comm`.
"""
from __future__ import annotations

import ast
import shlex

from memfit.errors import MemfitError
from memfit.interfaces.formats.base import (HF_ATTENTION_NAME, ImportedConfig, attention_from_hf, cannot,
                                            changed_knobs, read_text, same, verify_written)
from memfit.interfaces.formats.openrlhf_command import (FORMAT, PPO, PROFILE, RELEASES,
                                                        UNSUPPORTED_DEEPSPEED, Command, _launcher, flag_name,
                                                        flags_of, parse_command)
from memfit.interfaces.formats.openrlhf_knobs import _value, knobs_of
from memfit.interfaces.formats.openrlhf_ppo import read_ppo, role_knobs, write_roles


# device memory of an attention kernel, most first: the reading an ambiguous command gets
ATTENTION_MEMORY = ("eager", "sdpa", "flash")


def default_attention(version: str, script: str) -> str:
    """The attention a release runs when the command names none, from its own argparse defaults (the flag
    table): <= 0.8.9 has the switch --flash_attn (absent: transformers' eager), later ones --attn_implementation
    with its default."""
    flag = flag_name(version, script, "attention")
    if flag is None:  # every release has one: --flash_attn (<= 0.8.9) or --attn_implementation
        raise MemfitError(f"OpenRLHF {RELEASES[version]} {script}: no attention flag in its argparse table")
    spec = flags_of(version, script)[flag]
    if spec.get("action") == "store_true":
        return "flash" if spec.get("default") else "eager"
    return attention_from_hf(flag, flag, spec.get("default"))


def _release_for_attention(cmd: Command, version: str, where: str) -> tuple[str, list[str]]:
    """A command with no attention flag that several releases parse (legacy `--bf16` commands fit <= 0.8.9 and
    0.8.10-0.9.1) runs each release's default attention. When those differ, read the release whose default needs
    the most memory (a "fits" must hold for every release the command can be) and say so."""
    if len(cmd.fits) < 2 or any(flag_name(v, cmd.script, "attention") in cmd.flags for v in cmd.fits):
        return version, []
    defaults = {v: default_attention(v, cmd.script) for v in cmd.fits}
    if len(set(defaults.values())) < 2:
        return version, []
    chosen = min(cmd.fits, key=lambda v: ATTENTION_MEMORY.index(defaults[v]))
    others = "; ".join(f"OpenRLHF {RELEASES[v]} runs {defaults[v]}" for v in cmd.fits if v != chosen)
    return chosen, [f"{where}: no attention flag, and these flags fit several OpenRLHF releases: read as "
                    f"{RELEASES[chosen]}, which runs {defaults[chosen]} attention without one ({others}); "
                    "name the attention in the command if the run uses another release"]


def read(path_or_text, *, gpus: int | None = None, version: str | None = None) -> ImportedConfig:
    text, path = read_text(path_or_text, "OpenRLHF command")
    where = str(path) if path else "OpenRLHF command"
    cmd, detected = parse_command(text, where, version)
    notes: list[str] = []
    if version is None:
        version, notes = _release_for_attention(cmd, detected, where)
        if version != detected:
            cmd, version = parse_command(text, where, version)
    else:
        version = detected
    if cmd.script == PPO:  # roles, GPUs and vLLM from the command's own flags (openrlhf_ppo.py)
        return read_ppo(cmd, version, text, path, where, notes)
    world = _launcher(text, cmd)
    if gpus is not None:
        world["num_gpus"] = gpus
    knobs, assumed, warnings = knobs_of(cmd, version, where, world)
    assumed.insert(0, f"flag style of OpenRLHF {RELEASES[version]}")
    warnings += notes
    model = _value(cmd, version, "model")
    return ImportedConfig(format=FORMAT, profile=PROFILE, knobs=knobs, text=text, doc=cmd, path=path,
                          model_name=model if isinstance(model, str) and not model.startswith("$") else None,
                          world=world, variant=version, assumed=assumed, warnings=warnings,
                          unread=[w for w in warnings if "TOO LOW" in w])  # ZeRO++ hpZ's copy: it caps the verdict


# --- writing -------------------------------------------------------------------------------------------

def _need(imported: ImportedConfig, name: str, knob: str, value) -> str:
    version = imported.variant_read
    flag = flag_name(version, imported.doc.script, name)
    if flag is None:
        raise cannot(imported, knob, value, f"OpenRLHF {RELEASES[version]} {imported.doc.script} has no flag for it")
    return flag


def new_flags(imported: ImportedConfig, changes: dict) -> dict:
    cmd: Command = imported.doc
    version, script = imported.variant_read, cmd.script
    flags = dict(cmd.flags)
    specs = flags_of(version, script)

    def put(name: str, knob: str, value) -> None:
        """Set a valued flag; a value equal to the release default is written only if the flag is there."""
        flag = _need(imported, name, knob, value)
        if flag in flags or not same(specs[flag].get("default"), value):
            flags[flag] = value

    def switch(name: str, knob: str, on: bool) -> None:
        flag = _need(imported, name, knob, on) if on else flag_name(version, script, name)
        if on:
            flags[flag] = True
        elif flag:
            flags.pop(flag, None)

    roles = role_knobs(imported) if script == PPO else frozenset()
    for knob, value in changes.items():
        if knob in roles:
            continue  # with the other role knobs, below
        if knob == "zero_stage":
            put("zero_stage", knob, 2 if value is None else value)
        elif knob == "offload_optimizer":
            if value not in ("cpu", "none", None):
                raise cannot(imported, knob, value, "OpenRLHF offloads the optimizer to the CPU only (--adam_offload)")
            switch("adam_offload", knob, value == "cpu")
        elif knob == "pin_memory":
            if value is False:
                raise cannot(imported, knob, value, "OpenRLHF's get_train_ds_config hard-codes pin_memory: true "
                             "(edit openrlhf/utils/deepspeed/deepspeed_utils.py)")
        elif knob in UNSUPPORTED_DEEPSPEED:
            if not (knob == "offload_param" and value in ("none", None)) and not (knob == "ratio" and value in (1.0, None)):
                raise cannot(imported, knob, value, "OpenRLHF builds its DeepSpeed config in code without this "
                             "setting (openrlhf/utils/deepspeed/deepspeed_utils.py)")
        elif knob == "ref_offload":
            switch("ref_offload", knob, bool(value))
        elif knob == "checkpointing":
            if value not in ("full", "off", None):
                raise cannot(imported, knob, value, "OpenRLHF has full gradient checkpointing or none")
            switch("checkpointing", knob, value == "full")
        elif knob == "reentrant":
            switch("reentrant", knob, bool(value))
        elif knob == "attention":
            if version == "0.8.9":
                if value == "sdpa":
                    raise cannot(imported, knob, value, "OpenRLHF <= 0.8.9 has flash (--flash_attn) or eager")
                switch("attention", knob, value == "flash")
            else:
                put("attention", knob, HF_ATTENTION_NAME[value or "flash"])
        elif knob == "precision":
            if value not in ("bf16-mixed", "fp16-mixed"):
                raise cannot(imported, knob, value, "OpenRLHF trains with DeepSpeed bf16 or fp16 mixed precision")
            if version in ("0.8.9", "0.9.1"):
                if value != "bf16-mixed":
                    raise cannot(imported, knob, value, f"OpenRLHF {RELEASES[version]} has --bf16 only")
                switch("param_dtype", knob, True)
            else:
                put("param_dtype", knob, value[:4])
        elif knob == "micro_batch":
            put("micro_batch", knob, value)
        elif knob == "grad_accum":
            continue  # with micro_batch, below
        elif knob == "seq_len":
            put("seq_len", knob, value)
        elif knob == "tuning":
            rank = changes.get("lora_rank", imported.knobs.get("lora_rank")) or 8
            if value in ("lora", "qlora"):
                put("lora_rank", "lora_rank", rank)
                switch("load_in_4bit", knob, value == "qlora")
            elif value in ("full", None):
                for name in ("lora_rank", "load_in_4bit"):
                    switch(name, knob, False)
            else:
                raise cannot(imported, knob, value, "OpenRLHF trains full or LoRA/QLoRA")
        elif knob == "lora_rank":
            if changes.get("tuning", imported.knobs.get("tuning")) in ("lora", "qlora"):
                put("lora_rank", knob, value or 8)
        elif knob == "lora_alpha":
            put("lora_alpha", knob, value if value is not None else 16)
        elif knob == "lora_targets":
            flag = _need(imported, "lora_targets", knob, value)
            targets = list(value or ("all-linear",))
            if flag in flags or targets != ["all-linear"]:
                flags[flag] = targets
        elif knob == "lora_dropout":
            put("lora_dropout", knob, value or 0)
        elif knob == "padding":
            if value == "packed":
                raise cannot(imported, knob, value, "OpenRLHF packs without padding (--packing_samples = padding_free)")
            switch("packing", knob, value == "padding_free")
        elif knob == "loss":
            if value not in ("liger", "standard", None):
                raise cannot(imported, knob, value, "OpenRLHF has the standard loss or --use_liger_kernel")
            switch("liger", knob, value == "liger")
        elif knob == "overlap_comm":
            stage = changes.get("zero_stage", imported.knobs.get("zero_stage"))
            if value is False and stage == 3:
                raise cannot(imported, knob, value, "OpenRLHF leaves overlap_comm to DeepSpeed, which turns it on for ZeRO-3")
            switch("overlap_comm", knob, bool(value) and stage != 3 or (bool(value) and flag_name(
                version, script, "overlap_comm") in flags))
        elif knob == "grad_accum_dtype":
            if value is None:
                switch("grad_accum_dtype", knob, False)
            else:
                flags[_need(imported, "grad_accum_dtype", knob, value)] = value
        elif knob in ("engine",):
            if value not in ("deepspeed", None):
                raise cannot(imported, knob, value, "OpenRLHF runs DeepSpeed")
        elif knob == "optimizer":
            if value not in ("adamw-fused", None):
                raise cannot(imported, knob, value, "OpenRLHF uses DeepSpeed's Adam")
        elif knob == "method":
            if value != imported.knobs.get("method"):
                raise cannot(imported, knob, value, f"this is a {script} command")
        else:
            raise cannot(imported, knob, value, "OpenRLHF has no flag for it")
    if script == PPO:
        write_roles(imported, changes, put, switch)
    if "grad_accum" in changes and changes["grad_accum"] is not None and "grad_accum" not in roles:
        gpus = dict(imported.knobs["role_gpus"])["actor"] if script == PPO else imported.world.get("num_gpus")
        if not gpus:
            raise cannot(imported, "grad_accum", changes["grad_accum"],
                         "OpenRLHF sets the global batch (--train_batch_size); it needs the number of GPUs: say --gpus")
        micro = changes.get("micro_batch", imported.knobs.get("micro_batch"))
        split = (_value(imported.doc, version, "ring") or 1) * (_value(imported.doc, version, "tensor_parallel") or 1)
        put("global_batch", "grad_accum", micro * changes["grad_accum"] * (gpus // split))
    return flags


def _word(value) -> str:
    return shlex.quote(str(value))


def _render(flag: str, value) -> list[str]:
    if value is True:
        return [flag]
    if isinstance(value, list):
        return [flag] + [_word(v) for v in value]
    return [flag, _word(value)]


def edit_text(imported: ImportedConfig, flags: dict) -> str:
    cmd: Command = imported.doc
    text = imported.text
    edits: list[tuple[int, int, str]] = []
    line_start = lambda pos: text.rfind("\n", 0, pos) + 1  # noqa: E731
    tokens = cmd.tokens
    order = list(cmd.flags)
    kept = [f for f in order if f in flags]
    last_kept = order.index(kept[-1]) if kept else -1
    span_end = lambda f: (cmd.spans[f][1] or [cmd.spans[f][0]])[-1].end  # noqa: E731
    anchor = span_end(kept[-1]) if kept else cmd.module.end
    trailing = [f for f in order[last_kept + 1:] if f not in flags]
    if trailing:  # flags after the last kept one: cut from the end of the kept text to their end
        edits.append((anchor, span_end(trailing[-1]), ""))
    for index, flag in enumerate(order):
        tok, values = cmd.spans[flag]
        last = values[-1] if values else tok
        if flag not in flags and index < last_kept:
            begin, end = line_start(tok.start), text.find("\n", last.end)
            end = len(text) if end < 0 else end
            alone = not text[begin:tok.start].strip() and text[last.end:end].strip() in ("", "\\")
            if alone and cmd.multiline:
                edits.append((begin, end + 1, ""))
            else:
                following = tokens[tokens.index(last) + 1]
                edits.append((tok.start, following.start, ""))
        elif flag in flags and not same(cmd.flags[flag], flags[flag]):
            words = " ".join(_render(flag, flags[flag])[1:])
            if "=" in tok.value:
                edits.append((tok.start, tok.end, f"{flag}={words}"))
            elif values:
                edits.append((values[0].start, last.end, words))
            else:
                edits.append((tok.end, tok.end, " " + words))
    added = [f for f in flags if f not in cmd.flags]
    if added:
        if cmd.multiline:
            first = tokens[0] if tokens else cmd.module
            indent = text[line_start(first.start):first.start]
            indent = indent if indent and not indent.strip() else "   "
            insert = "".join(f" \\\n{indent}{' '.join(_render(f, flags[f]))}" for f in added)
        else:
            insert = "".join(" " + " ".join(_render(f, flags[f])) for f in added)
        edits.append((anchor, anchor, insert))
    out = text
    for start, end, replacement in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        out = out[:start] + replacement + out[end:]
    return out


def write(imported: ImportedConfig, knobs: dict) -> str:
    """The same script with only the changed flags edited, added (one per line, in the file's style)
    or removed, in the flag style of the release the command was written for."""
    changes = changed_knobs(imported, knobs)
    flags = new_flags(imported, changes)
    text = edit_text(imported, flags)
    again = read(text, gpus=imported.world.get("num_gpus") if "num_gpus" in imported.world else None,
                 version=imported.variant)
    if again.doc.flags != flags:
        raise cannot(imported, "flags", list(flags), "internal error: the edited command does not read back")
    verify_written(imported, again, {k: v for k, v in changes.items() if k in again.knobs or v is None})
    return text


def arguments(imported: ImportedConfig) -> list[str]:
    """The training script's arguments, as argparse receives them (for validation)."""
    return [t.value for t in imported.doc.tokens]


# --- a fresh command -----------------------------------------------------------------------------------

def export(knobs: dict, model_name: str | None = None, *, version: str = "0.11.2", script: str | None = None,
           gpus: int | None = None, global_batch: int | None = None) -> str:
    """`deepspeed --module openrlhf.cli.train_*` for these knobs, one flag per line."""
    script = script or {"dpo": "train_dpo", "rm": "train_rm"}.get(knobs.get("method") or "", "train_sft")
    model_flag = flag_name(version, script, "model")
    base = f"deepspeed --module openrlhf.cli.{script} \\\n   {model_flag} {_word(model_name or 'MODEL')}\n"
    placeholder = read(base, version=version)  # the release's default global batch may not fit `gpus` yet
    placeholder.world["num_gpus"] = gpus or 1
    wanted = {k: v for k, v in knobs.items() if k not in ("engine", "method")}
    wanted.setdefault("grad_accum", 1)  # written as --train_batch_size = micro x accumulation x GPUs
    text = write(placeholder, {**placeholder.knobs, **wanted})
    if gpus:
        text = text.replace("deepspeed --module", f"deepspeed --num_gpus {gpus} --module", 1)
    return text


# --- code edits: knobs OpenRLHF has no flag for ------------------------------------------------------------

def edit_function(source: str, function: str, lines: list[str]) -> str:
    """`source` with `lines` inserted just before the last `return` of `function` (e.g. OpenRLHF's
    get_train_ds_config, which builds the DeepSpeed config memfit cannot reach with a flag)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise MemfitError(f"cannot read the Python source to edit: {e}") from None
    node = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function), None)
    ret = next((n for n in reversed(node.body) if isinstance(n, ast.Return)), None) if node else None
    if ret is None:
        raise MemfitError(f"no function {function}() ending in a return statement in that source")
    text = source.splitlines(keepends=True)
    indent = text[ret.lineno - 1][:ret.col_offset]
    added = [f"{indent}{line}\n" for line in lines]
    return "".join(text[:ret.lineno - 1] + added + text[ret.lineno - 1:])
