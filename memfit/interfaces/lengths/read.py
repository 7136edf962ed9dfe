"""`--lengths DATA`: the training data's token lengths, one per sample, from a file.

Accepted: integers (one a line or whitespace separated), a JSON list of integers, or JSONL rows with `length`,
`input_ids` (its len), or for preference data `chosen_input_ids` / `rejected_input_ids` (or `chosen_length` /
`rejected_length`). A DPO pair is one sample whose length is the longer of the two: TRL pads chosen and rejected
to one length and runs them as two rows. Raw text needs a tokenizer from the hub and is refused here.
Bad input: one MemfitError naming the file and the line."""
from __future__ import annotations

import json
from dataclasses import dataclass

from memfit.errors import MemfitError

_ROW_KEYS = ("length", "input_ids")
_PAIR_KEYS = (("chosen_length", "rejected_length"), ("chosen_input_ids", "rejected_input_ids"))


@dataclass(frozen=True)
class Lengths:
    tokens: tuple[int, ...]  # per sample; for pairs the longer of chosen and rejected
    pairs: bool  # preference pairs (two rows per sample)
    source: str


def read_lengths(path: str) -> Lengths:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise MemfitError(f"{path}: not a text file (expected token lengths: integers, a JSON list or JSONL)") from None
    head = text.lstrip()[:1]
    if head == "[":
        tokens, pairs = _json_list(path, text), False
    elif head == "{":
        tokens, pairs = _jsonl(path, text)
    else:
        tokens, pairs = _integers(path, text), False
    if not tokens:
        raise MemfitError(f"{path}: no token lengths in the file")
    return Lengths(tuple(tokens), pairs, path)


def _length(path: str, line: int, value, what: str) -> int:
    """A sample's length: a positive integer (bool and 2.5 refused), or a list's len."""
    if isinstance(value, list):
        value = len(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise MemfitError(f"{path}:{line}: {what} {value!r} is not a positive whole number of tokens")
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
            out.append(_length(path, n, value, "length"))
    return out


def _json_list(path: str, text: str) -> list[int]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise MemfitError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise MemfitError(f"{path}:1: expected a JSON list of token lengths")
    line_of = _line_index(text)
    return [_length(path, line_of(i), v, f"item {i}") for i, v in enumerate(data)]


def _line_index(text: str):
    """The line of a JSON list's i-th item, good enough for an error: one item a line, else line 1."""
    lines = text.count("\n")
    return lambda i: i + 2 if lines > 1 else 1


def _jsonl(path: str, text: str) -> tuple[list[int], bool]:
    out, kinds = [], set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise MemfitError(f"{path}:{n}: not a JSON row ({e.msg})") from None
        if not isinstance(row, dict):
            raise MemfitError(f"{path}:{n}: expected a JSON object per line")
        value, pair = _row_length(path, n, row)
        out.append(value)
        kinds.add(pair)
    if len(kinds) > 1:
        raise MemfitError(f"{path}: mixes chosen/rejected pairs with single rows; give one kind of data")
    return out, kinds == {True}


def _row_length(path: str, n: int, row: dict) -> tuple[int, bool]:
    for chosen, rejected in _PAIR_KEYS:
        if chosen in row or rejected in row:
            if chosen not in row or rejected not in row:
                raise MemfitError(f"{path}:{n}: a pair needs both {chosen} and {rejected}")
            return max(_length(path, n, row[chosen], chosen), _length(path, n, row[rejected], rejected)), True
    for key in _ROW_KEYS:
        if key in row:
            return _length(path, n, row[key], key), False
    if "text" in row or "prompt" in row or "messages" in row:
        raise MemfitError(f"{path}:{n}: raw text needs the model's tokenizer, which memfit does not load; write the "
                          "token counts (length or input_ids) into the file")
    raise MemfitError(f"{path}:{n}: no length, input_ids, or chosen/rejected lengths in the row")
