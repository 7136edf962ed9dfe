"""Files and flags written for other LLaMA-Factory releases, read as the pinned release's keys and values
(tables/llamafactory_other_releases.json), with a warning naming the release each comes from; never a refusal.

- renamed: a key another release (or the transformers 4.x its TrainingArguments came from) called otherwise:
  `dpo_beta` is pref_beta, `evaluation_strategy` eval_strategy, `per_gpu_train_batch_size` the micro-batch;
- values: a value the pinned release spells otherwise: `flash_attn: true` (0.1.8 .. 0.6.3) is fa2,
  `quantization_method: bitsandbytes` (0.8.3 .. 0.9.2) is bnb, `stage: orpo` is stage dpo with pref_loss orpo;
- summed: 0.1.x's max_source_length + max_target_length are one row's cutoff_len;
- memory: a key no pinned key stands for that changes memory: named; it caps the verdict when memfit's estimate
  without it can be too low;
- any other key of another release: named and read as not changing memory;
- defaults: a launch through an entry point only older releases ship (src/train_bash.py) that leaves unstated
  a setting whose default in some of those releases holds more memory than the pinned default: the release is
  not known, so that larger default is read (an assumption, named): the estimate holds for each of them.
"""
from __future__ import annotations

import json

from memfit.interfaces.formats.base import as_int, bad, same, shown
from memfit.interfaces.formats.not_modelled import CAPS, OFF
from memfit.interfaces.formats.tables import table

PINNED = "LLaMA-Factory " + table("llamafactory")["source"].split()[-1]


def facts() -> dict:
    return table("llamafactory_other_releases")


def spelled(value) -> str:
    """A value as the table's rows key it (JSON: true, "off"); any YAML value has one (a date: its text)."""
    return json.dumps(value, default=str)


def releases_of(key: str) -> str | None:
    """The releases whose parser took `key` ("LLaMA-Factory 0.1.6 .. 0.7.1", "transformers 4.37.2 .. 4.45.2
    (...)"), or None: no release memfit knows of did."""
    f = facts()
    return f["keys"].get(key) or f["transformers_keys"].get(key)


def entry_point(script: str) -> str | None:
    """The LLaMA-Factory training script a launch names (`../../src/train_bash.py` -> src/train_bash.py)."""
    path = script.replace("\\", "/")
    return next((e for e in facts()["entry_points"] if path == e or path.endswith("/" + e)
                 or ("/" + path).endswith("/" + e.removeprefix("src/"))), None)


class Reading:
    """One document brought to the pinned release's keys (`doc`): the warnings, assumptions and unread lines
    (by the ImportedConfig list they join: unread, unread_host) on the way."""

    def __init__(self, doc: dict, where: str):
        self.doc, self.where = dict(doc), where
        self.warnings: list[str] = []
        self.assumed: list[str] = []
        self.unread: dict[str, list[str]] = {"unread": [], "unread_host": []}

    def warn(self, key: str, text: str, errs: str | None = None) -> None:
        line = f"{self.where}: {key}: {text}"
        self.warnings.append(line)
        if errs in CAPS:
            self.unread[CAPS[errs]].append(line)

    def put(self, old: str, now: str, value, wins: bool = False) -> None:
        """`old`'s value as `now` (a file saying both differently is an error unless the old name wins)."""
        if now in self.doc and self.doc[now] is not None and not same(self.doc[now], value) and not wins:
            raise bad(self.where, old, f"{shown(value)} but {now} says {shown(self.doc[now])}; {old} is {now}'s "
                      f"name in {releases_of(old)}: keep one")
        if value is not None:  # None: the older key said nothing the pinned key holds (use_auth_token: true)
            self.doc[now] = value


def current(doc: dict, where: str, script: str | None = None) -> Reading:
    """The document in the pinned release's keys and values; `script`: the entry point a launch ran (for the
    older releases' defaults)."""
    r = Reading(doc, where)
    _summed(r)
    for key in [k for k in doc if k in r.doc and releases_of(k)]:
        _older_key(r, key)
    _values(r)
    if script is not None:
        _defaults(r, entry_point(script))
    return r


def _summed(r: Reading) -> None:
    for now, row in facts()["summed"].items():
        given = [k for k in row["keys"] if k in r.doc]
        if not given:
            continue
        if now in r.doc:
            raise bad(r.where, given[0], f"{given[0]} is {row['releases']}'s, {now} the later releases': keep one")
        values = {k: as_int(r.where, k, r.doc.pop(k), minimum=1) if k in r.doc else default
                  for k, default in row["keys"].items()}
        total = values[row["pt"]] if r.doc.get("stage") == "pt" else sum(values.values())
        r.doc[now] = total
        said = " + ".join(f"{k} {shown(v)}" for k, v in values.items())
        r.warn(given[0], f"keys of {row['releases']}, read as {now} {total} ({said}): {row['why']}")


def _older_key(r: Reading, key: str) -> None:
    f, value = facts(), r.doc.pop(key)
    releases = releases_of(key)
    if key in f["renamed"]:
        row = f["renamed"][key]
        if "values" in row:
            value = row["values"].get(spelled(value), value)
        r.put(key, row["now"], value, row.get("wins", False))
        r.warn(key, f"a key of {releases}, not of {PINNED}: read as {row['now']}"
               + (f" {shown(value)}" if value is not None else " (unset)") + f" ({row['why']})")
    elif key in f["memory"] and value not in OFF:
        row = f["memory"][key]
        r.warn(key, f"{shown(value)}: a key of {releases}, not of {PINNED}: not modelled: {row['does']}; memfit "
               f"estimates {row['memfit']}", row["errs"])
    else:
        r.warn(key, f"a key of {releases}, not of {PINNED}; read as not changing memory")


def _values(r: Reading) -> None:
    for key, rows in facts()["values"].items():
        row = rows.get(spelled(r.doc.get(key))) if key in r.doc else None
        if row is None:
            continue
        old = r.doc[key]
        r.doc[key] = row["now"]
        for also, value in row.get("also", {}).items():
            if r.doc.get(also) is not None and not same(r.doc[also], value):
                raise bad(r.where, key, f"{shown(old)} is how {row['releases']} said {key} {shown(row['now'])} with "
                          f"{also} {shown(value)}, but {also} says {shown(r.doc[also])}: keep one")
            r.doc[also] = value
        r.warn(key, f"{shown(old)} is how {row['releases']} said {key} {shown(row['now'])}"
               + "".join(f", {k} {shown(v)}" for k, v in row.get("also", {}).items()) + f" ({row['why']})")


def _default(key: str):
    """The pinned release's default of a key (tables/llamafactory.json)."""
    return next(keys[key] for cls, keys in table("llamafactory").items() if cls != "source" and key in keys)["default"]


def _defaults(r: Reading, script: str | None) -> None:
    """A setting left to an older release's default that holds more memory than the pinned default: read as
    that default (the release is not known; the estimate then holds for each release of the script)."""
    tuning = r.doc.get("finetuning_type", _default("finetuning_type"))
    for row in facts()["defaults"]:
        if row["entry_point"] != script or row["key"] in r.doc or tuning not in row.get("finetuning_type", [tuning]):
            continue
        r.doc[row["key"]] = row["old"]
        r.assumed.append(f"{row['key']}={shown(row['old'])}: unstated, and {script} is "
                         f"{facts()['entry_points'][script]}'s; {row['releases']} defaulted to it ({row['why']}), "
                         f"which holds more memory than {PINNED}'s {shown(_default(row['key']))}")


def respell(before: dict, after: dict, where: str, script: str | None = None) -> dict:
    """A rewritten document in the file's own spelling: a key it names by another release's name is written
    under that name; a key it says in a form memfit does not write back (0.1.x's summed lengths, `flash_attn:
    true`, `adafactor: true`), or that the releases of the launch's `script` spell otherwise (`unwritable`), is
    refused when it changes (MemfitError naming it), so the file stays one release's."""
    f = facts()
    for key, row in f["unwritable"].get(script, {}).items():
        if key in after and not same(after[key], before.get(key)) and after[key] in row.get("values", [after[key]]):
            raise bad(where, key, f"{shown(after[key])} does not run on every release of {script} "
                      f"({f['entry_points'][script]}): {row['why']}; set it by hand for yours")
    names = {row["now"]: old for old, row in f["renamed"].items() if old in before and "values" not in row}
    fixed = {row["now"]: (old, releases_of(old)) for old, row in f["renamed"].items()
             if old in before and "values" in row}
    fixed |= {now: (next(k for k in row["keys"] if k in before), row["releases"]) for now, row in f["summed"].items()
              if any(k in before for k in row["keys"])}
    fixed |= {key: (key, rows[spelled(before[key])]["releases"]) for key, rows in f["values"].items()
              if key in before and spelled(before[key]) in rows}
    read = current(before, where).doc
    out = dict(after)
    for now, (old, releases) in fixed.items():
        if now in out and not same(out[now], before.get(now)) and not same(out[now], read.get(now)):
            raise bad(where, old, f"{shown(before[old])} is how {releases} said {now}; memfit writes {PINNED}'s keys "
                      f"and values: change {now} by hand, or write the file in {PINNED}'s")
    for now, old in names.items():
        if now in out and now not in before:  # a key the file says under both names keeps both
            out[old] = out.pop(now)
    return out
