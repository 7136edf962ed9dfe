"""What the model's own logits and loss hold under a transformers release (data/loss_tail.toml, measured by running
each release's modeling code: memfit/trace/loss_tail.py). Bytes per logit element (tokens x vocabulary):
(forward peak, saved for backward, backward peak).

The pinned release's standard loss is memory/activations.py's formula, which tests/trace/test_loss_tail.py checks
against this table's row of the pinned release; the table is read for a release the user names
(`--framework-version transformers=4.44`) and for the in-place cross entropy, which has no formula.
"""
from __future__ import annotations

from memfit.facts.data_table import data_table
from memfit.facts.releases import parse_version
from memfit.facts.versions import pinned

Tail = tuple[float, float, float]


def _table() -> dict:
    return data_table("loss_tail.toml")


def measured_release(version: str) -> str | None:
    """The measured release whose facts stand for `version` (its `covers` range holds it), or None."""
    got, key = parse_version("transformers", version), lambda v: parse_version("transformers", v)
    for release, facts in _table()["transformers"].items():
        low, high = facts["covers"]
        if key(low) <= got < key(high):
            return release
    return None


def transformers_release(s) -> str | None:
    """The measured release standing for the transformers the run names; None when it names none (the pin)."""
    named = dict(s.releases).get("transformers")
    return measured_release(named) if named else None


def loss_tail(s, logits_bytes: int) -> Tail:
    """(forward peak, saved, backward peak) per logit element of this run's loss. A family the release was not
    measured on takes the largest measured family's bytes: a guess toward more memory (`notes` says so)."""
    families = _families(s)
    column = ("bf16" if logits_bytes == 2 else "fp32") + ("_inplace_ce" if s.loss == "inplace_ce" else "")
    if column == "bf16" and s.autocast:  # autocast's cross entropy copies 16-bit logits to fp32 (GPT-2 style, < 4.48)
        column = "bf16_autocast"
    if s.model.arch in families:
        return tuple(families[s.model.arch][column])
    return max((tuple(f[column]) for f in families.values()), key=lambda t: (t[0], t[2]))


def _families(s) -> dict:
    return _table()["transformers"][transformers_release(s) or pinned()["transformers"]]["families"]


def notes(s) -> list[str]:
    """What the estimate assumed about the loss, for the run's "assumed" list."""
    release = transformers_release(s)
    if s.loss != "inplace_ce" and not release:
        return []
    release = release or pinned()["transformers"]
    low, high = _table()["transformers"][release]["covers"]
    out = [f"logits and loss as measured on transformers {release}'s own code (standing for {low} .. {high}; "
           "data/loss_tail.toml)"]
    if s.model.arch not in _families(s):
        out.append(f"the loss of a {s.model.arch} model was not measured on transformers {release}: the largest "
                   "measured family's bytes are used")
    return out
