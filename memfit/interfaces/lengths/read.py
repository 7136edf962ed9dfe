"""`--lengths DATA`: the training data's token lengths, one per sample.

DATA is a file, a folder or a dataset name:
- integers (one a line or whitespace separated), or a JSON list of integers;
- JSONL rows, or a Parquet file's rows (tables.py), or a dataset saved with `datasets`' save_to_disk (a folder,
  its train split), or a dataset name `datasets` loads (offline-aware; `org/name:split` picks a split): a row
  gives `length`, `input_ids` (its len), for preference data `chosen_input_ids` / `rejected_input_ids` (or
  `chosen_length` / `rejected_length`), or raw text (`text`, `prompt` + `completion`, `messages`) counted with the
  model's tokenizer (and chat template) the way TRL's SFT counts it (text.py).
A DPO pair is one sample whose length is the longer of the two: TRL pads chosen and rejected to one length and
runs them as two rows. Bad input: one MemfitError naming the file and the line (or row)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from memfit.errors import MemfitError
from memfit.facts import hub

if TYPE_CHECKING:  # text.py is imported on the first raw-text row only
    from memfit.interfaces.lengths.text import TextCounter

_ROW_KEYS = ("length", "input_ids")
_PAIR_KEYS = (("chosen_length", "rejected_length"), ("chosen_input_ids", "rejected_input_ids"))
FILE_SUFFIXES = (".txt", ".json", ".jsonl", ".parquet", ".csv", ".arrow")
VALID = ("integers, a JSON list, JSONL / Parquet / a save_to_disk folder / a dataset name with rows of length, "
         "input_ids, chosen_/rejected_ lengths or ids, or text / prompt+completion / messages")


@dataclass(frozen=True)
class Lengths:
    tokens: tuple[int, ...]  # per sample; for pairs the longer of chosen and rejected
    pairs: bool  # preference pairs (two rows per sample)
    source: str
    tokenizer: str | None = None  # where raw text was counted, when the data had any


def read_lengths(path: str, model=None) -> Lengths:
    """`model` (a catalog ModelSpec) gives the tokenizer for raw text; without it text rows are refused."""
    from memfit.interfaces.lengths import tables

    p = Path(path).expanduser()
    if p.is_dir():
        if not tables.is_saved_dataset(p):
            raise MemfitError(f"{path}: a folder, but not a dataset saved with save_to_disk (no state.json or "
                              f"dataset_dict.json); give {VALID}")
        return _from_rows(path, tables.saved_dataset_rows(str(p)), model, "row")
    if p.suffix == ".parquet" or _parquet_magic(p):
        return _from_rows(path, tables.parquet_rows(str(p)), model, "row")
    if not p.exists():
        name = path.partition(":")[0]
        if hub.looks_like_hub_id(name) and Path(name).suffix not in FILE_SUFFIXES:  # data/x.jsonl: a missing file
            return _from_rows(path, tables.named_dataset_rows(path), model, "row")
        raise MemfitError(f"{path}: no such file or folder (and not an org/name dataset id); give {VALID}")
    return _from_text(path, str(p), model)


def _parquet_magic(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"PAR1"
    except OSError:
        return False


def _from_text(path: str, file: str, model) -> Lengths:
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise MemfitError(f"{path}: not a text file (expected {VALID})") from None
    except OSError as e:
        raise MemfitError(f"{path}: cannot read it ({e.strerror})") from None
    head = text.lstrip()[:1]
    if head == "[":
        return _done(path, _json_list(path, text), False)
    if head == "{":
        return _from_rows(path, _jsonl(path, text), model, "line")
    return _done(path, _integers(path, text), False)


def _done(path: str, tokens: list[int], pairs: bool, tokenizer: str | None = None) -> Lengths:
    if not tokens:
        raise MemfitError(f"{path}: no token lengths in the file")
    return Lengths(tuple(tokens), pairs, path, tokenizer)


def _length(where: str, value, what: str) -> int:
    """A sample's length: a positive integer (bool, 2.5, NaN refused), or a list's len."""
    if isinstance(value, list):
        value = len(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (
            float("inf"), float("-inf")) or value != int(value) or value < 1:
        raise MemfitError(f"{where}: {what} {value!r:.40} is not a positive whole number of tokens")
    return int(value)


def _integers(path: str, text: str) -> list[int]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for word in line.split():
            try:
                value = int(word)
            except ValueError:
                raise MemfitError(f"{path}:{n}: {word[:40]!r} is not an integer token length (expected integers, "
                                  "a JSON list or JSONL rows with length / input_ids)") from None
            out.append(_length(f"{path}:{n}", value, "length"))
    return out


def _json_list(path: str, text: str) -> list[int]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise MemfitError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise MemfitError(f"{path}:1: expected a JSON list of token lengths")
    line_of = _line_index(text)
    return [_length(f"{path}:{line_of(i)}", v, f"item {i}") for i, v in enumerate(data)]


def _line_index(text: str):
    """The line of a JSON list's i-th item, good enough for an error: one item a line, else line 1."""
    lines = text.count("\n")
    return lambda i: i + 2 if lines > 1 else 1


def _jsonl(path: str, text: str) -> list[tuple[int, dict]]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise MemfitError(f"{path}:{n}: not a JSON row ({e.msg})") from None
        if not isinstance(row, dict):
            raise MemfitError(f"{path}:{n}: expected a JSON object per line")
        out.append((n, row))
    return out


def _from_rows(path: str, rows, model, unit: str) -> Lengths:
    """Rows (JSONL lines, or a table's rows numbered from 1) to lengths; one kind of data only."""
    reader = _RowReader(path, model)
    out, kinds = [], set()
    numbered = rows if unit == "line" else enumerate(rows, 1)
    for n, row in numbered:
        value, pair = reader.length(f"{path}:{n}" if unit == "line" else f"{path}: row {n}", row)
        out.append(value)
        kinds.add(pair)
    if len(kinds) > 1:
        raise MemfitError(f"{path}: mixes chosen/rejected pairs with single rows; give one kind of data")
    return _done(path, out, kinds == {True}, reader.counter.source if reader.counter else None)


class _RowReader:
    """One row's length; the tokenizer is loaded on the first raw-text row only."""

    def __init__(self, path: str, model):
        self.path, self.model = path, model
        self.counter: TextCounter | None = None  # loaded on the first raw-text row

    def length(self, where: str, row: dict) -> tuple[int, bool]:
        for chosen, rejected in _PAIR_KEYS:
            if chosen in row or rejected in row:
                if chosen not in row or rejected not in row:
                    raise MemfitError(f"{where}: a pair needs both {chosen} and {rejected}")
                return max(_length(where, row[chosen], chosen), _length(where, row[rejected], rejected)), True
        for key in _ROW_KEYS:
            if key in row:
                return _length(where, row[key], key), False
        if "chosen" in row or "rejected" in row:
            raise MemfitError(f"{where}: preference pairs as text are not counted (TRL's DPO tokenization is not "
                              "modelled); give chosen_input_ids / rejected_input_ids or their lengths")
        if any(k in row for k in ("text", "prompt", "completion", "messages")):
            return _length(where, self._text(where, row), "text"), False
        raise MemfitError(f"{where}: no length, input_ids, chosen/rejected lengths or text in the row")

    def _text(self, where: str, row: dict) -> int:
        from memfit.interfaces.lengths.text import text_counter

        if self.counter is None:
            if self.model is None:
                raise MemfitError(f"{where}: raw text needs the model's tokenizer; write the token counts (length "
                                  "or input_ids) into the file")
            try:
                self.counter = text_counter(self.model)
            except MemfitError as e:
                raise MemfitError(f"{where}: {e}") from None
        return self.counter.count(where, row)
