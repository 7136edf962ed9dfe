"""The keys of an HF `TrainingArguments` / TRL config file across releases: which shape a file is (by its keys),
each key's type and default in the release the key table comes from, and other releases' names of a memory
setting (read as this release's; the writer keeps the file's spelling)."""
from __future__ import annotations

from memfit.interfaces.formats.base import bad, same, shown, suggest
from memfit.interfaces.formats.tables import check_type, table

CLASSES = {"training_args": ("TrainingArguments",),
           "sft": ("ScriptArguments", "SFTConfig", "ModelConfig", "DatasetMixtureConfig"),
           "dpo": ("ScriptArguments", "DPOConfig", "ModelConfig", "DatasetMixtureConfig")}


def keys(variant: str) -> dict:
    known = {}
    for cls in CLASSES[variant]:
        known.update(table("hf")[cls])
    return known


def detect(doc: dict, name: str = "") -> str:
    t = table("hf")
    ta, sft, dpo = set(t["TrainingArguments"]), set(t["SFTConfig"]), set(t["DPOConfig"])
    script = set(t["ModelConfig"]) | set(t["ScriptArguments"]) | set(t["DatasetMixtureConfig"])
    present = set(doc)
    if present & (dpo - sft - ta):
        return "dpo"
    if present & (sft - dpo - ta):
        return "sft"
    if present & (script | ((sft & dpo) - ta)):
        return "dpo" if "dpo" in name.lower() else "sft"
    return "training_args"


def other_releases() -> dict:
    """Keys of other transformers / TRL releases (tables/hf_other_releases.json): renamed ones and the words of
    a memory setting."""
    return table("hf_other_releases")


def other_release(variant: str, key: str) -> str | None:
    """The releases whose config classes accepted `key` when the pinned one does not ("TRL 0.9.6 .. 0.28.0";
    tables/hf_other_releases.json "keys", written by tools/trl_release_keys.py), or None."""
    return other_releases().get("keys", {}).get(variant, {}).get(key)


def current_names(doc: dict, where: str, assumed: list[str]) -> dict:
    """The document with another release's names of a memory setting (`max_seq_length`, `torch_dtype`) read as
    this release's; the file itself keeps its spelling (the writer edits the key it has)."""
    out = dict(doc)
    for old, rename in other_releases()["renamed"].items():
        if old not in doc:
            continue
        now = rename["now"]
        if now in doc and not same(doc[now], doc[old]):
            raise bad(where, old, f"{shown(doc[old])} but {now} says {shown(doc[now])}; {old} is {now}'s older name")
        out[now] = out.pop(old)
        assumed.append(f"{old}={shown(doc[old])} read as {now}: {rename['why']}")
    return out


def spelling(doc: dict, now: str) -> str:
    """The key the file uses for `now` (its older name when it has that), for the writer."""
    return next((old for old, r in other_releases()["renamed"].items() if r["now"] == now and old in doc), now)


def check_keys(doc: dict, variant: str, where: str) -> list[str]:
    """Types of the known keys; an unknown key is a warning naming the release the key table comes from (other
    releases and recipe scripts add keys: alignment-handbook's dataset_mixture), unless its name says it is a
    memory setting memfit would then not read (a refusal, not a misread). A key another TRL release accepted
    (max_prompt_length, use_logits_to_keep) is a warning naming those releases, memory word or not."""
    known = keys(variant)
    framework = "transformers" if variant == "training_args" else "TRL"
    words = other_releases()["memory_words"]
    warnings = []
    for key, value in doc.items():
        if key in known:
            check_type(where, key, value, known[key])
        elif releases := other_release(variant, key):  # another release's parser takes it: a warning, not a refusal
            warnings.append(f"{where}: {key}: a key of {releases}, not of {table('hf')['source']} (the releases "
                            "memfit's key table comes from); memfit does not model it, so the estimate leaves it out")
        elif any(w in str(key).lower() for w in words):
            raise bad(where, key, f"unknown key that looks like a memory setting: not in {table('hf')['source']} "
                      f"(the releases memfit's key table comes from), so memfit cannot read it{suggest(str(key), known)}")
        else:
            warnings.append(f"{where}: {key}: not a {framework} key in {table('hf')['source']} (the releases "
                            "memfit's key table comes from); read as not changing memory")
    return warnings


def default(variant: str, key: str):
    return keys(variant).get(key, {}).get("default")


def get(doc: dict, variant: str, key: str):
    return doc[key] if key in doc and doc[key] is not None else default(variant, key)


def ckpt_key(doc: dict) -> str:
    """The file's own spelling; new keys get transformers 5's name (`gradient_*` is a deprecated alias)."""
    return "gradient_checkpointing" if "gradient_checkpointing" in doc else "activation_checkpointing"


def ckpt_kwargs_key(doc: dict) -> str:
    return "gradient_checkpointing_kwargs" if "gradient_checkpointing_kwargs" in doc else \
        "activation_checkpointing_kwargs"
