"""What an estimate rests on that the user did not say, one record each: which knob, its value, where it came from.

An `Assumption` is its prose (a `str`, so every renderer prints it as it always has) carrying the record beside
it: the knob it is about (None when it is about no single knob: a model fact, the error band), the value
memfit took, and its source:
  profile  a framework profile's default (data/frameworks/*.toml)
  release  a framework release's facts (data/releases.toml)
  config   the user's own file: a key read, ignored or not read
  catalog  the model or GPU catalog, a hub config.json, or the model's own code
  method   the training method and its framework's placement of models (data/methods.toml)
  memfit   memfit's own rule where nothing says (several GPUs and no engine: DDP), and its error bands
`--json` lists the records under "assumption_records"; text output prints the prose.
"""
from __future__ import annotations

from collections.abc import Iterable

SOURCES = ("profile", "release", "config", "catalog", "method", "memfit")


class Assumption(str):
    """One assumption: the prose people read, and `knob`, `value`, `source` for programs."""

    knob: str | None
    value: object
    source: str

    def __new__(cls, text: str, source: str = "memfit", knob: str | None = None,
                value: object = None) -> Assumption:
        if source not in SOURCES:
            raise ValueError(f"assumption source {source!r} is not one of {', '.join(SOURCES)}")
        made = super().__new__(cls, text)
        made.source, made.knob, made.value = source, knob, value
        return made

    def record(self) -> dict:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"knob": self.knob, "value": value, "source": self.source, "text": str(self)}


def from_source(notes: Iterable[str], source: str) -> list[Assumption]:
    """Prose notes as records of one source; a note that already is a record keeps its own."""
    return [n if isinstance(n, Assumption) else Assumption(n, source) for n in notes]


def records(notes: Iterable[str]) -> list[dict]:
    """The records of a list of assumptions, for JSON (a plain string counts as memfit's own)."""
    return [n.record() for n in from_source(notes, "memfit")]
