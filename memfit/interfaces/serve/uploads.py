"""Framework files in and out of `memfit serve`, as text only: an upload is read by memfit's own readers
(interfaces/formats) from its text, and an export is returned as text. No path from a request is opened.

A file that names another file (LLaMA-Factory / HF `deepspeed: ds.json`, accelerate's deepspeed_config_file, a
launch script) is refused: its reader would open that path on the server's disk. A YAML whose aliases expand past
what its own text could hold (a "billion laughs" file) is refused before any reader walks it: PyYAML shares an
aliased value, so parsing is cheap, but every walk, repr or JSON answer over it would visit each copy.
"""
from __future__ import annotations

from pathlib import Path

from memfit.errors import MemfitError
from memfit.interfaces.formats.base import shown
from memfit.interfaces.serve.requests import FieldError, display_name

MAX_TEXT = 256 * 1024  # characters: framework configs are a few KB (the body limit also applies)
# an exported file's name when the format writes one file without a name of its own
FILE_NAMES = {"deepspeed": "ds_config.json", "llamafactory": "train.yaml", "openrlhf": "train.sh",
              "accelerate": "accelerate_config.yaml", "hf": "training_args.yaml"}


def read_upload(body) -> dict:
    """{"name": file name (display only), "text": the file} -> the knobs memfit reads from it."""
    from memfit.interfaces.formats import MODULES, detect_format

    if not isinstance(body, dict) or not isinstance(body.get("text"), str):
        raise FieldError("send {\"name\": the file's name, \"text\": its content}", "text")
    name = display_name(body["name"]) if isinstance(body.get("name"), str) else "upload"
    text = body["text"]
    if len(text) > MAX_TEXT:
        raise FieldError(f"{name}: {len(text):,} characters is not a framework config (up to {MAX_TEXT:,})", "text")
    if not text.strip():
        raise FieldError(f"{name}: the file is empty", "text")
    text = text if text.endswith("\n") else text + "\n"  # a newline makes memfit's readers take it as text, not a path
    _refuse_alias_bombs(text, name)
    fmt = "config"  # until the format is known
    try:
        fmt = detect_format(text, name)
        _refuse_named_files(fmt, text, name)
        imported = MODULES[fmt].read(text)
    except MemfitError as e:
        raise FieldError(_named(str(e), name), "text") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as e:
        # a reader that trips over a value of an unexpected type: the user gets a line, not a bare 500
        raise FieldError(f"{name}: memfit's {fmt} reader cannot read this file ({type(e).__name__}: "
                         f"{shown(str(e))}); check each setting's type against the framework's docs", "text") from None
    from memfit.interfaces.cli.args import file_notes, file_unread

    unread = [n.replace(imported.name, name) for n in file_unread(imported, host=False)]
    return {"name": name, "format": imported.format, "profile": imported.profile, "model": imported.model_name,
            "knobs": {k: _json(v) for k, v in imported.knobs.items() if v is not None},
            "world": imported.world, "unread": unread,
            "notes": [n for n in (n.replace(imported.name, name) for n in file_notes(imported)) if n not in unread]}


def _named(message: str, name: str) -> str:
    """memfit's readers name text by its format ("LLaMA-Factory YAML: ..."); the user knows it by its file name."""
    return message if message.startswith(name) else f"{name}: {message}"


def _refuse_alias_bombs(text: str, name: str) -> None:
    """Refuse YAML whose aliases (*name) repeat values past what text of this length can spell out: without
    aliases every value takes at least one character, so more values than 2 x characters means aliases did it."""
    import yaml

    if "*" not in text or text.lstrip().startswith("{"):
        return  # no alias, or JSON (which has none)
    try:
        doc = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError):
        return  # not YAML: the format's reader says what is wrong with it
    budget = 2 * len(text) + 1000
    if not _within(doc, budget):
        raise FieldError(f"{name}: its YAML aliases (*anchor) expand to over {budget:,} values, more than "
                         f"{len(text):,} characters can spell out; write the settings out without aliases", "text")


def _within(doc, budget: int) -> bool:
    """Whether walking `doc` as every reader does (each alias expanded) visits at most `budget` values; stops as
    soon as it would visit more, so a self-referring or exponentially aliased value costs at most `budget` steps."""
    stack = [doc]
    while stack:
        budget -= 1
        if budget < 0:
            return False
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple, set)):
            stack.extend(value)
    return True


def _refuse_named_files(fmt: str, text: str, name: str) -> None:
    from memfit.interfaces.formats import jsontext, yamltext

    if fmt == "launch":
        raise MemfitError("a launch script names other files, which the server does not read; upload the framework "
                          "config it launches (LLaMA-Factory YAML, DeepSpeed JSON, OpenRLHF command, ...)")
    if fmt not in ("llamafactory", "hf", "accelerate"):
        return
    doc = jsontext.load(text, name) if text.lstrip().startswith("{") else yamltext.load(text, name)
    if not isinstance(doc, dict):
        return  # the format's reader says what is wrong with it
    dsc = doc.get("deepspeed_config")
    named = (doc.get("deepspeed") if isinstance(doc.get("deepspeed"), str) else None) if fmt != "accelerate" else (
        dsc.get("deepspeed_config_file") if isinstance(dsc, dict) else None)
    if named:
        key = "deepspeed" if fmt != "accelerate" else "deepspeed_config.deepspeed_config_file"
        raise MemfitError(f"{key}: {shown(named)} names a file on disk, which the server does not read; remove the "
                          "key and set ZeRO in the form, or use `memfit estimate --from` on your machine")


def _json(value):
    return list(value) if isinstance(value, tuple) else value


FORMAT_NAMES = {"deepspeed": "a DeepSpeed JSON", "llamafactory": "a LLaMA-Factory YAML", "openrlhf": "an OpenRLHF command",
                "accelerate": "an accelerate YAML", "hf": "an HF / TRL arguments YAML"}


def export(scenario, fmt, **options) -> dict:
    """The scenario as fresh file(s) in `fmt` (formats.export_scenario): [{"name", "text"}]."""
    from memfit.interfaces.formats import FORMATS, export_scenario

    if fmt not in FORMATS or fmt == "launch":
        raise FieldError(f"format {shown(fmt)}: choose one of: {', '.join(f for f in FORMATS if f != 'launch')}",
                         "format")
    files = export_scenario(scenario, fmt, **options)
    return {"format": fmt, "files": [{"name": Path(f.path).name if f.path else FILE_NAMES[fmt], "text": f.new_text}
                                     for f in files]}
