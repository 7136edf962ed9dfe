"""Facts that follow the framework's release (data/releases.toml): `--framework-version trl=0.8.6` makes the
estimate model that release's code (its defaults, how it computes DPO log-probs) instead of the pinned one.

Without a version nothing here applies: the profiles describe the pinned releases (data/versions.toml). A
version outside every range memfit has read is refused, naming the ranges, rather than guessed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from memfit.errors import MemfitError
from memfit.facts.data_table import data_table
from memfit.facts.versions import pinned

# 4.44 / 0.8.6 / 1.16.0rc1 / 0.19.8.dev0 / 2.13.0+cpu: the numeric release, then an optional pre/post/local tail
_VERSION = re.compile(r"^v?(\d+(?:\.\d+){0,3})(?:[.+-]?(?:a|b|rc|post|dev|\+)[0-9a-z.+-]*)?$", re.IGNORECASE)


@dataclass(frozen=True)
class ReleaseFacts:
    defaults: dict  # knob -> value, with the release that sets it: {knob: (value, "transformers 4.44")}
    methods: dict  # [methods] keys of the profile replaced
    notes: tuple[str, ...]  # what was assumed about the releases themselves


def packages() -> dict:
    return data_table("releases.toml")["package"]


def parse_version(package: str, text: str) -> tuple[int, ...]:
    """'4.44' -> (4, 44, 0); anything not a release number is a one-line error."""
    m = _VERSION.match(str(text).strip())
    if not m:
        raise MemfitError(f"--framework-version {package}={text!r}: not a release number (write e.g. {package}="
                          f"{pinned().get(package, '1.2.3')})")
    parts = tuple(int(p) for p in m.group(1).split("."))
    return parts + (0,) * (3 - len(parts)) if len(parts) < 3 else parts


def _ranges_text(package: str) -> str:
    return ", ".join(f"[{r['from']}, {r['to']})" for r in packages()[package]["range"])


def release_range(package: str, version: str) -> dict:
    """The range of data/releases.toml holding `version`, or an error naming the known ranges."""
    got = parse_version(package, version)
    for r in packages()[package]["range"]:
        if parse_version(package, r["from"]) <= got < parse_version(package, r["to"]):
            return r
    raise MemfitError(f"--framework-version {package}={version}: memfit has read no {package} release in that range; "
                      f"known ranges: {_ranges_text(package)} (data/releases.toml)")


def check_versions(versions: dict[str, str]) -> dict[str, str]:
    """Package names lower-cased and checked; each version must be a release number (any package) and in a
    known range (packages with release facts)."""
    out = {}
    for name, version in versions.items():
        key = name.strip().lower().replace("_", "-")
        if key not in packages() and key not in pinned():
            raise MemfitError(f"--framework-version {name}={version}: memfit knows the releases of "
                              f"{', '.join(packages())} (and pins {', '.join(p for p in pinned() if p not in packages())})")
        if key in packages():
            release_range(key, version)
        else:
            parse_version(key, version)
        out[key] = str(version).strip()
    return out


def completed(versions: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """An older TRL names the transformers it ran with (`pairs_with`) when the user names none."""
    out, notes = dict(versions), list[str]()
    if "trl" not in out:
        return out, notes
    trl = release_range("trl", out["trl"])
    if "transformers" not in out and trl.get("pairs_with"):
        out["transformers"] = trl["pairs_with"]
        notes.append(f"transformers {trl['pairs_with']} assumed with trl {out['trl']} (a release of its time; say "
                     "--framework-version transformers=VERSION)")
    floor = trl.get("needs_transformers")
    if "transformers" in out and floor and parse_version("transformers", out["transformers"]) < \
            parse_version("transformers", floor):
        raise MemfitError(f"trl {out['trl']} installs with transformers >= {floor}, not {out['transformers']} "
                          "(data/releases.toml); say the versions the run uses")
    return out, notes


@cache
def release_facts(profile: str, versions: tuple[tuple[str, str], ...], tuning: str = "full") -> ReleaseFacts:
    """What the given releases change for a run of `profile` that trains `tuning` (a range's `by_tuning` defaults:
    the recipe configs of that tuning)."""
    defaults: dict[str, tuple[object, str]] = {}
    methods: dict[str, str] = {}
    notes: list[str] = []
    fp32_logits = False
    for name, version in versions:
        if name not in packages():
            notes.append(f"{name} {version}: memfit has no release facts for {name}; its pinned release "
                         f"({pinned()[name]}) is modelled")
            continue
        if profile not in packages()[name]["profiles"]:
            notes.append(f"{name} {version}: changes nothing memfit models for profile {profile}")
            continue
        r = release_range(name, version)
        kept = set(r.get("profile_keeps", {}).get(profile, ()))
        said = r.get("defaults", {}) | r.get("by_tuning", {}).get(tuning, {})
        defaults |= {k: (v, f"{name} {version}") for k, v in said.items() if k not in kept}
        methods |= r.get("methods", {})
        fp32_logits |= r.get("model_logits") == "fp32"
    if fp32_logits and "logits" in methods:
        methods["logits"] = _fp32_variant(methods["logits"])
    return ReleaseFacts(defaults, methods, tuple(notes))


def _fp32_variant(kind: str) -> str:
    """The kind of a framework that computes log-probs on fp32 logits, when the model's forward returned them."""
    return f"{kind}_fp32" if f"{kind}_fp32" in data_table("methods.toml")["logits"] else kind


def expert_lora(arch: str, versions: tuple[tuple[str, str], ...] = ()) -> str:
    """What PEFT LoRA does with a MoE family's routed experts under the run's transformers release (the one
    given, else the pinned one): "linear" (transformers 4: one nn.Linear per expert and projection, LoRA on
    each), else the family's peft_stacked_experts for transformers 5's stacked 3-D experts: "fused" (adapted
    through target_parameters, the gate and up LoRA fused) or "none" (not adapted)."""
    stored = release_range("transformers", dict(versions).get("transformers") or pinned()["transformers"])
    if stored.get("moe_experts", "linear") == "linear":
        return "linear"
    from memfit.facts.catalog import architectures

    return architectures()[arch].get("peft_stacked_experts", "fused")
