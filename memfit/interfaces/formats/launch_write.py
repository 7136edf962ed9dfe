"""`memfit fit` on a launch: each changed knob written in the file (or command-line word) of the launch that
states it, as one set of files.

Which source gets a knob: every source whose part states it (launch_merge.stated: a value said, not a default
filled in); when none does, the first source whose format can say it, in the order the framework would read it
from: a DeepSpeed setting from the DeepSpeed JSON (or the file naming one), then accelerate's config, then the
training arguments; any other knob from the training arguments first. Each source's part is written by its
format's own writer; for a part merged from a file and command-line words, the keys its writer changed go back
where they came from: a key a word states is changed in that word (only the value token; comments,
continuations and quoting around it stay), any other key in the file (edited in its own syntax), or added as a
new `--flag` when the part is the script's flags alone. A change no source can say is one MemfitError naming it.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
from pathlib import Path

from memfit.errors import MemfitError
from memfit.interfaces.formats import jsontext, yamltext
from memfit.interfaces.formats.base import WrittenFile, launch_path, shown
from memfit.interfaces.formats.launch_shell import array_close
from memfit.interfaces.formats.launch_sources import Launch, OwnFlags, Script, Source, launcher_flag, region

TRAINING = ("llamafactory", "hf", "openrlhf")


def sayable(launch: Launch) -> frozenset[str]:
    """The knobs some source of the launch can say. Training arguments say DeepSpeed's knobs only through a
    DeepSpeed config they hold or name: in a launch the engine is often another file's (accelerate's), and a knob
    the run moves on the way (pin_memory beside an offload) is then one no file holds, not a refusal."""
    from memfit.facts.knobs import said_by

    def one(src: Source) -> frozenset[str]:
        part = src.part
        if src.own is None and part.format == "hf" and "deepspeed" not in part.companions \
                and not isinstance(part.doc.get("deepspeed"), dict):
            return said_by("hf")
        return _says(src)

    return frozenset().union(*(one(s) for s in launch.sources))


def _says(src: Source) -> frozenset[str]:
    """The knobs one source can say: a script's own flags' (launch_dschat.Flags), else its format's."""
    from memfit.interfaces.formats import sayable as said

    return src.own.says if src.own is not None else said(src.part)


def _order(launch: Launch, knob: str) -> list[int]:
    from memfit.interfaces.formats.deepspeed import KNOBS

    def rank(s: Source) -> int:
        fmt = s.part.format
        if knob in KNOBS or knob == "engine":
            return 0 if fmt == "deepspeed" or "deepspeed" in s.part.companions else 1 if fmt == "accelerate" else 2
        return 0 if fmt in TRAINING else 1 if fmt == "accelerate" else 2

    return sorted(range(len(launch.sources)), key=lambda i: rank(launch.sources[i]))


def route(launch: Launch, knobs: dict) -> dict[int, dict]:
    """Source index -> the knobs written there."""
    from memfit.interfaces.formats.launch_merge import stated

    out: dict[int, dict] = {}
    for knob, value in knobs.items():
        stating = [i for i, s in enumerate(launch.sources) if stated(s.part, knob)]
        home = stating or [i for i in _order(launch, knob) if knob in _says(launch.sources[i])][:1]
        if not home:
            formats = ", ".join(sorted({s.part.format for s in launch.sources}))
            raise MemfitError(f"{launch.name}: no file of the launch can say {knob}={shown(value)} (it has {formats} "
                              "settings); that change needs a file of another kind")
        for i in home:
            out.setdefault(i, {})[knob] = value
    return out


def write(launch: Launch, knobs: dict) -> list[WrittenFile]:
    """Every file of the launch that changes for `knobs` (the launch script first), nothing written yet."""
    from memfit.interfaces.formats import write_config_files

    files: dict[Path, WrittenFile] = {}
    words: dict[Path, list] = {}  # script -> (start, end, new text) edits
    for i, group in route(launch, knobs).items():
        src = launch.sources[i]
        if src.own is not None:  # the script's own flags say these knobs (launch_dschat.Flags)
            words.setdefault(_script(src).path, []).extend(_own_flags(src, src.own, group))
            continue
        written = write_config_files(src.part, group, None)
        if src.direct:
            _add(files, written[0])
        else:
            _back_to_sources(src, written[0], files, words)
        for w in written[1:]:
            _add(files, w)
    scripts = []
    for s in launch.scripts:
        if s.path in words:
            scripts.append(WrittenFile(s.path, s.text, _apply(s.text, words[s.path])))
    named = [WrittenFile(Path(launch_path(_path(f))), f.old_text, f.new_text) for f in files.values() if f.changed]
    return scripts + named  # paths from here when under it, as fit prints them


def _add(files: dict, w: WrittenFile) -> None:
    """One file written by two sources must come out the same (a DeepSpeed JSON two files name)."""
    key = _path(w).resolve()
    had = files.get(key)
    if had is not None and had.changed and w.changed and had.new_text != w.new_text:
        raise MemfitError(f"{w.path}: two files of the launch would change it differently; fit it on its own")
    if had is None or (w.changed and not had.changed):
        files[key] = w


def _path(w: WrittenFile) -> Path:
    """Where a file of the launch goes: every one a launch writes was read from a path (or is new beside one)."""
    if w.path is None:
        raise MemfitError("a file of the launch was read as text, not from a path; memfit fit rewrites files")
    return Path(w.path)


def _script(src: Source) -> Script:
    """The launch script whose words state `src`'s keys."""
    if src.script is None:
        raise MemfitError(f"{src.part.name}: no launch script states it, so no word of one can change")
    return src.script


# --- keys back to the file or the word that said them ----------------------------------------------------

def _load(text: str, name: str):
    return jsontext.load(text, name) if text.lstrip().startswith("{") else yamltext.load(text, name)


def _changes(old, new, path=(), nested=False) -> list[tuple[tuple, object]]:
    """(key path, new value) of every key that differs (a missing value: the key goes); accelerate's sections
    are walked into, other values compared whole."""
    from memfit.interfaces.formats.base import same

    out = []
    for key in list(old) + [k for k in new if k not in old]:
        a, b = old.get(key, _GONE), new.get(key, _GONE)
        if nested and isinstance(a, dict) and isinstance(b, dict):
            out += _changes(a, b, path + (key,), nested)
        elif a is _GONE or b is _GONE or not same(a, b):
            out.append((path + (key,), b))
    return out


_GONE = object()


def _back_to_sources(src: Source, main: WrittenFile, files: dict, words: dict) -> None:
    part = src.part
    new_doc = _load(main.new_text, part.name)
    file_changes = []
    for path, value in _changes(part.doc, new_doc, nested=part.format == "accelerate"):
        flag = src.flags.get(path)
        if flag is not None:
            words.setdefault(_script(src).path, []).append(_word_edit(src, path, flag, value))
        elif src.file is not None:
            file_changes.append((path, value))
        elif src.appendable and (key := _new_key(src, path)) and value is not _GONE \
                and not isinstance(value, (dict, list)):
            words.setdefault(_script(src).path, []).append(_new_flag(src, key, value))
        else:
            raise MemfitError(f"{_script(src).path.name}: {'.'.join(path)}: the launch has no file for it and no word "
                              "of the command line that says it; memfit does not add one there (a mapping or a "
                              "list, e.g. an inline DeepSpeed config, needs a file)")
    if file_changes and src.file is not None:
        _add(files, _file_edit(src.file, file_changes))


def _own_flags(src: Source, own: OwnFlags, knobs: dict) -> list[tuple[int, int, str]]:
    """The word edits that say `knobs` in a script's own flags: a value changed where it is typed, a switch turned on
    (True) or a flag no word states added; a switch on the line is never dropped (changed by hand)."""
    edits = []
    for flag, value in own.changes(knobs).items():
        if (flag,) in src.flags:
            if value is False:
                raise MemfitError(f"{_script(src).path.name}: --{flag}: memfit would have to drop this switch; change "
                                  "it by hand")
            edits.append(_word_edit(src, (flag,), flag, value))
        elif value is not False:
            edits.append(_new_word(src, f"--{flag}" if value is True else f"--{flag} {_word(value, '--')}"))
    return edits


def _file_edit(path: Path, changes: list) -> WrittenFile:
    text = path.read_text(encoding="utf-8")
    doc = _load(text, path.name)
    new = _copy(doc)
    for keys, value in changes:
        node = new
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        if value is _GONE:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = value
    editor = jsontext if text.lstrip().startswith("{") else yamltext
    return WrittenFile(path, text, editor.edit(text, doc, new, str(path)))


def _copy(doc):
    import copy

    return copy.deepcopy(doc)


# --- words of the command line ----------------------------------------------------------------------------

_VALUE = r"""(?:'[^']*'|"(?:[^"\\]|\\.)*"|[^\s'";&|<>#\\])+"""


def _word_edit(src: Source, path: tuple, flag: str, value) -> tuple[int, int, str]:
    """The edit of the value word of `flag` (the last one that says it: the one the parser keeps)."""
    script = _script(src)
    if flag.startswith("!") or value is _GONE or (isinstance(value, (list, dict)) and src.style == "--"):
        raise MemfitError(f"{script.path.name}: {'--' if src.style == '--' else ''}{flag.lstrip('!')}: memfit would "
                          f"have to {'drop' if value is _GONE else 'rewrite'} this switch; change it by hand")
    name = re.escape(flag).replace("_", "[-_]")
    if src.style == "=":
        pattern = rf"(?<![\w.-]){name}=(?P<value>{_VALUE})?"
    else:
        pattern = rf"(?<![\w-])--{name}(?:=(?P<eq>{_VALUE})?|(?P<gap>[ \t]+(?:\\\n[ \t]*)*)(?P<value>{_VALUE}))?"
    found, start = [], 0
    for start, end in [region(script, src.where), *_array_regions(script, src.where)]:
        found = list(re.finditer(pattern, script.text[start:end]))
        if found:
            break
    if not found:
        raise MemfitError(f"{script.path.name}: cannot find {flag} on the launch line to change it; change it by hand")
    m = found[-1]
    group = "eq" if m.groupdict().get("eq") is not None else "value"
    typed = m.group(group) if m.group(group) is not None else None
    if typed is not None and typed.startswith("-"):
        typed = None  # a switch followed by the next flag
    if typed is not None and "$" in typed:
        raise MemfitError(f"{script.path.name}: {flag} {typed}: the value is a shell variable; set it where the "
                          f"variable is set (memfit would change it to {shown(value)})")
    word = _word(value, src.style)
    if typed is None:  # a bare switch: its value follows it
        at = start + m.start() + len(m.group(0).split()[0] if src.style == "--" else m.group(0))
        return at, at, f" {word}" if src.style == "--" else word
    return start + m.start(group), start + m.end(group), word


def _array_regions(script, where: str) -> list[tuple[int, int]]:
    """The bodies of the bash arrays the launch command expands ("${ARGS[@]}"): the last `ARGS=(` before the command
    and the `ARGS+=(` after it, latest first (a flag is changed where its last saying is)."""
    start, end = region(script, where)
    before = script.text[:start]
    out = []
    for name in dict.fromkeys(re.findall(r"\$\{(\w+)\[[@*]\]\}", script.text[start:end])):
        sets = list(re.finditer(rf"(?m)^[ \t]*(?:export[ \t]+|declare[ \t]+-a[ \t]+|local[ \t]+)?{name}(\+?)=\(", before))
        fresh = max((i for i, m in enumerate(sets) if not m.group(1)), default=0)
        out += [(m.end(), array_close(before, m.end()) or len(before)) for m in reversed(sets[fresh:])]
    return out


def _word(value, style: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):  # only `key=value` overrides get here (OmegaConf reads both)
        text = json.dumps(value) if isinstance(value, dict) else ",".join(map(str, value))
    else:
        text = str(value)
    return text if re.fullmatch(r"[\w.,:/@+-]+", text) else shlex.quote(text)


def _new_key(src: Source, path: tuple) -> str | None:
    """The flag a new key is added as: the launcher's own flag for its config's key, the key of a script flag."""
    if src.where == "before":
        return launcher_flag(path)
    return path[0] if len(path) == 1 else None


def _new_flag(src: Source, key: str, value) -> tuple[int, int, str]:
    return _new_word(src, f"--{key} {_word(value, '--')}")


def _new_word(src: Source, flag: str) -> tuple[int, int, str]:
    """`flag` (`--key value`, or a bare switch) added after the command's last word (before a redirection or
    comment on its last line); in a command written one flag per line, as a line of its own in the same style. A
    launcher's flag goes just before the training script."""
    script = _script(src)
    if src.where == "before":
        return _before_target(script, flag)
    lines = script.text.split("\n")
    last = max(i for i in range(script.first - 1, script.last) if lines[i].strip())
    line = lines[last]
    cut = re.search(r"(?:^|\s+)(?:\d*>>?|&>|\||;|&&|#)", line)
    end = cut.start() if cut else len(line.rstrip())
    at = sum(len(x) + 1 for x in lines[:last])
    if last == script.first - 1:
        return at + end, at + end, f" {flag}"
    above = lines[last - 1] if not line[:end].strip() else line
    indent = above[:len(above) - len(above.lstrip(" \t"))]
    if not line[:end].strip():  # the last line holds only the redirection: the flag goes on a line before it
        return at, at, f"{indent}{flag} \\\n"
    return at + end, at + end, f" \\\n{indent}{flag}"


def _before_target(script, flag: str) -> tuple[int, int, str]:
    """A launcher's new flag, just before the training script: on the script's line when the launcher's words
    share it; when the script starts a line of its own (the launcher's words end in a continuation), as a line of
    its own before it, in the script line's indent, so each line still holds one launcher or script word."""
    at = region(script, "before")[1]
    line_start = script.text.rfind("\n", 0, at) + 1
    indent = script.text[line_start:at]
    if line_start > 0 and not indent.strip() and script.text[:line_start - 1].rstrip(" \t").endswith("\\"):
        return line_start, line_start, f"{indent}{flag} \\\n"
    return at, at, f"{flag} "


def _apply(text: str, edits: list) -> str:
    replaced = [(start, end) for start, end, _ in set(edits) if start != end]
    if len(replaced) != len(set(replaced)):
        raise MemfitError("two files of the launch would change one word of its command line differently")
    for start, end, new in sorted(set(edits), key=lambda e: (e[0], e[1], e[2]), reverse=True):
        text = text[:start] + new + text[end:]
    return text


# --- reading the launch back as it will be ----------------------------------------------------------------

def root(launch: Launch, files: list[WrittenFile]) -> Path:
    """The folder holding every file of the launch (the layout kept under --out and for the read-back)."""
    folders = [Path(p).resolve().parent for p in launch.files() | {_path(f) for f in files}]
    folders += [s.cwd.resolve() for s in launch.scripts if s.cwd is not None]  # `cd ..` must land inside the copy
    return Path(os.path.commonpath(folders))


def reread(launch: Launch, files: list[WrittenFile], gpus: int | None):
    """The whole launch read again with `files` in place of what is on disk: a copy of its files in a
    temporary folder, the same layout, so every relative path and `cd` resolves as it will."""
    from memfit.interfaces.formats import read_configs

    top = root(launch, files)
    new = {_path(f).resolve(): f.new_text for f in files}
    with tempfile.TemporaryDirectory(prefix="memfit-fit-") as tmp:
        for path in launch.files() | {_path(f) for f in files}:
            real = Path(path).resolve()
            copy = Path(tmp) / real.relative_to(top)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(new.get(real, real.read_text(encoding="utf-8") if real.exists() else ""), encoding="utf-8")
        return read_configs([Path(tmp) / p.resolve().relative_to(top) for p in launch.inputs], gpus=gpus)


def target(launch: Launch, files: list[WrittenFile], path: Path, out: Path | None) -> Path:
    """Where a file of the change set goes: itself (--in-place) or its place in the launch's layout under --out."""
    if out is None:
        return Path(path)
    place = Path(out) / Path(path).resolve().relative_to(root(launch, files))
    if place.resolve() == Path(path).resolve():
        raise MemfitError(f"--out {out} would overwrite {path} itself; use --in-place (keeps a backup) or another "
                          "--out folder")
    return place
