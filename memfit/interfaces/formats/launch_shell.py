"""The shell, as far as a launch needs it: `\\` continuations, comments, quotes (shlex), `VAR=...` / `export VAR=...`
with $VAR / ${VAR} / ${VAR:-default} of variables set earlier (others stay as typed), bash arrays (`ARGS=(...)`,
`ARGS+=(...)`, "${ARGS[@]}", ${ARGS[i]}), `cd DIR`, redirections, `;` `&&` `|` between commands (launch.py reads
which command is the training launch and follows it)."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from memfit.interfaces.formats.base import bad

_VAR = re.compile(r"\$(?:\{(\w+)(?:(:?[-=])([^}]*))?\}|(\w+))")
_ARRAY_START = re.compile(r"\s*(?:export\s+|declare\s+-a\s+|local\s+(?:-a\s+)?)?[A-Za-z_]\w*\+?=\(")
_ARRAY_SET = re.compile(r"\s*(?:export\s+|declare\s+-a\s+|local\s+(?:-a\s+)?)?([A-Za-z_]\w*)(\+?)=\((.*)\)\s*", re.S)
_ARRAY_USE = re.compile(r'(")?\$\{(\w+)\[(@|\*|\d+)\]\}(")?')
_REDIRECT = re.compile(r"(?<![^\s])\d*(?:>>?|<|&>)(?:&\d+|\s*[^\s;&|<>]+)")
WRAPPERS = ("nohup", "time", "exec", "env", "stdbuf")
KEYWORDS = ("then", "do", "else", "elif", "{", "!")
_POSITIONAL = re.compile(r"\$(\d|\{\d+\})")  # an argument of the script ($1, ${2})
_SCRIPT_DIR = re.compile(r"^\$\(dirname [^)]*\)/+([^$]*)$")  # `$(dirname "$0")/..`: the relative tail


@dataclass
class Command:
    line: int
    argv: list[str]
    env: dict = field(default_factory=dict)
    cwd: Path = Path(".")


# --- the shell, as far as a launch needs it ----------------------------------------------------------------

def logical_lines(text: str, where: str):
    """(first line number, text) of each command line: continuations joined, quotes that span lines kept whole."""
    lines = text.replace("\r\n", "\n").split("\n")
    i = 0
    while i < len(lines):
        start, parts, quote = i + 1, [], None
        while i < len(lines):
            line = lines[i]
            i += 1
            quote = _open_quote(line, quote)
            tail = len(line) - len(line.rstrip("\\"))
            if quote is None and tail % 2:  # a `\` continuation
                parts.append(line[:-1] + " ")
                continue
            if quote == '"' and tail % 2:  # inside "...", bash drops `\`+newline (Qwen's DISTRIBUTED_ARGS="...")
                parts.append(line[:-1])
                continue
            parts.append(line + ("\n" if quote else ""))
            if quote is None and not _array_open("".join(parts)):
                break
            if quote is None:  # `ARGS=(` over several lines: its words, one line each, up to the `)`
                parts.append("\n")
        if quote is not None:
            raise bad(where, None, f"line {start}: no closing quotation (an unterminated {quote} quote)")
        unclosed = _unclosed_array("".join(parts))
        if unclosed is not None:
            raise bad(where, None, f"line {start}: the array `{unclosed.group(0).strip()}` has no closing `)`")
        yield start, "".join(parts)


def _open_quote(line: str, quote: str | None) -> str | None:
    """The quote still open at the end of `line`, starting inside `quote` (one pass: a script of many lines with an
    unbalanced quote stays linear)."""
    i = 0
    while i < len(line):
        c = line[i]
        if quote == "'":
            quote = None if c == "'" else quote
        elif c == "\\":
            i += 1
        elif quote == '"':
            quote = None if c == '"' else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t;&|"):
            break
        i += 1
    return quote


def _array_open(text: str) -> bool:
    """A `NAME=(` array assignment whose `)` has not come yet."""
    return _unclosed_array(text) is not None


def _unclosed_array(text: str) -> re.Match[str] | None:
    """The `NAME=(` that starts `text` when its `)` has not come yet."""
    m = _ARRAY_START.match(text)
    return m if m is not None and array_close(text, m.end()) is None else None


def array_close(text: str, i: int) -> int | None:
    """The offset of the `)` that closes an array body starting at `i` (quotes, comments and nested parentheses
    skipped), None when the text ends first."""
    depth, quote = 1, None
    while i < len(text):
        c = text[i]
        if quote:
            quote = None if c == quote else quote
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == "#" and text[i - 1] in " \t\n(":
            i = text.find("\n", i)
            if i < 0:
                return None
        elif c in "()":
            depth += 1 if c == "(" else -1
            if not depth:
                return i
        i += 1
    return None


def _expand_arrays(text: str, arrays: dict) -> str:
    """"${NAME[@]}" / ${NAME[@]} / ${NAME[*]} of an array set earlier become its words, ${NAME[i]} one of them;
    arrays not set stay as typed."""
    def words(m):
        before, name, index, after = m.groups()
        values = arrays.get(name)
        if values is None:
            return m.group(0)
        values = values[int(index):int(index) + 1] if index.isdigit() else values
        if bool(before) != bool(after):  # inside a longer "..." string: the words joined by spaces
            return (before or "") + " ".join(values) + (after or "")
        return shlex.join(values) if values else "''"
    return _ARRAY_USE.sub(words, text)


def substitute(text: str, variables: dict, escape: bool = True) -> str:
    """$VAR, ${VAR} and ${VAR:-default} of the variables set so far (a default's own $VARs too), outside single
    quotes; others stay as typed. `escape`: quote the values for the shell words they land in."""
    if "$" not in text:
        return text
    out, i, double = [], 0, False
    while i < len(text):
        c = text[i]
        if c == "\\":
            out.append(text[i:i + 2])
            i += 2
            continue
        if c == "'" and not double:
            end = text.find("'", i + 1)
            end = len(text) - 1 if end < 0 else end
            out.append(text[i:end + 1])
            i = end + 1
            continue
        m = _VAR.match(text, i) if c == "$" else None
        if m:
            name, op, default, end = _reference(text, m)
            value = variables.get(name)
            if op is not None and (value is None or (value == "" and op.startswith(":"))):
                # ${VAR:-x}: x when VAR is unset or empty; ${VAR-x}: only when unset
                value = substitute(default, variables, escape=False)
            special = ('"\\$`' if double else "'\"\\") if escape else ""
            if escape and not double and value is not None and "$(" in value:
                special += " \t"  # a $(command) memfit cannot run stays one word, as in the assignment it sits in
            out.append(text[i:end] if value is None else "".join("\\" + x if x in special else x for x in value))
            i = end
            continue
        double = not double if c == '"' else double
        out.append(c)
        i += 1
    return "".join(out)


def _reference(text: str, m: re.Match) -> tuple[str, str | None, str, int]:
    """(name, `:-` / `-` / `:=` / `=` or None, default, end) of the $VAR / ${VAR...} at m; a default may hold
    ${...} and $(...) of its own (`${NAME:-run_${MODEL}_$(date +%F)}`), matched to its closing brace."""
    name = m.group(1) or m.group(4)
    if m.group(2) is None:
        return name, None, "", m.end()
    start = m.start(3)
    depth, i = 1, start
    while i < len(text) and depth:
        if text.startswith("${", i) or text.startswith("$(", i):
            depth, i = depth + 1, i + 2
            continue
        depth -= text[i] in "})"
        i += 1
    return name, m.group(2), text[start:i - 1], i


def _words(line: str, where: str, number: int) -> list[str]:
    lexer = shlex.shlex(_REDIRECT.sub(" ", line), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        return list(lexer)
    except ValueError as e:
        raise bad(where, None, f"line {number}: {str(e).lower()}") from None


def _assignment(word: str) -> tuple[str, str] | None:
    name, eq, value = word.partition("=")
    return (name, value) if eq and re.fullmatch(r"[A-Za-z_]\w*", name) else None


def commands_of(text: str, where: str, cwd: Path) -> list[Command]:
    """Every simple command of the script with the variables and folder it runs with."""
    variables: dict = {}
    arrays: dict[str, list[str]] = {}
    out = []
    for number, line in logical_lines(text, where):
        line = substitute(_expand_arrays(line, arrays), variables)
        array = _ARRAY_SET.fullmatch(line)
        if array:  # ARGS=(...) / ARGS+=(...): a bash array; "$ARGS" alone is its first word
            name, append, body = array.groups()
            values = (arrays.get(name, []) if append else []) + _words(body, where, number)
            arrays[name] = values
            variables[name] = values[0] if values else ""
            continue
        words = _words(line, where, number)
        for segment in _segments(words):
            while segment and segment[0] in KEYWORDS:  # `then X=1`: the body of an if / for, read in order
                segment.pop(0)
            env: dict[str, str] = {}
            while segment and (pair := _assignment(segment[0])) is not None:
                segment.pop(0)
                env[pair[0]] = pair[1]
            while segment and segment[0] in WRAPPERS:  # nohup / env X=1 / stdbuf -oL: the command after them
                segment.pop(0)
                while segment and (_assignment(segment[0]) or segment[0].startswith("-")):
                    pair = _assignment(segment.pop(0))
                    env.update([pair] if pair else [])
            if not segment:  # `MODEL=$1` in an option loop: the script read as run without arguments keeps MODEL
                variables.update((k, v) for k, v in env.items() if not (k in variables and _POSITIONAL.fullmatch(v)))
            elif segment[0] == "export":
                variables.update(a for a in map(_assignment, segment[1:]) if a)
            elif segment[0] == "cd":
                cwd = _cd(cwd, segment[1:], where)
            else:
                out.append(Command(number, segment, {**variables, **env}, cwd))
    return out


def _segments(words: list[str]):
    segment: list[str] = []
    for w in words:
        if w and set(w) <= set(";&|"):
            yield segment
            segment = []
        else:
            segment.append(w)
    yield segment


def _cd(cwd: Path, args: list[str], where: str) -> Path:
    if not args or args[0] in ("-", "~"):
        return cwd
    if "dirname" in args[0] or "BASH_SOURCE" in args[0] or "$0" in args[0]:
        # cd "$(dirname "$0")": the script's folder, where paths already resolve from; "$(dirname "$0")/..": the
        # folder above it (Qwen's finetune/*.sh run from the repository root)
        tail = _SCRIPT_DIR.match(args[0])
        return (cwd / tail.group(1)).resolve() if tail and tail.group(1) else cwd
    if "$" in args[0]:
        raise bad(where, None, f"cd {args[0]}: the script does not set that variable, so memfit cannot tell the "
                  "folder the launch runs in")
    folder = cwd / Path(args[0]).expanduser()
    try:
        return folder.resolve()
    except (OSError, ValueError):
        return folder
