"""Framework profiles (data/frameworks/NAME.toml, schema in its README.md): what memfit assumes of a run under
each framework: its default knob values, how it fills DeepSpeed "auto" keys, what `memfit plan` may change,
and how it runs preference / RL methods."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache

from memfit.errors import MemfitError
from memfit.facts.catalog import HERE
from memfit.facts.names import unknown_key

FOLDER = HERE / "frameworks"


@dataclass(frozen=True)
class Framework:
    name: str
    description: str
    defaults: dict  # knob -> value when the user does not say
    deepspeed_auto: str  # "hf" or "deepspeed"
    plan: dict  # what `memfit plan` may change
    methods: dict  # how it runs preference / RL methods
    model_code: dict = field(default_factory=dict)  # the framework's own model code as memory sees it (torchtune)
    fsdp: dict = field(default_factory=dict)  # whose FSDP wrapping it runs (accelerate's: HF Trainer)
    # defaults the framework itself replaces on a card below a compute capability ({capability, read, knob: value})
    below_capability: dict = field(default_factory=dict)

    def defaults_for(self, capability: float) -> dict:
        """Its defaults on a card of this compute capability: what it falls back to below `below_capability`."""
        rule = self.below_capability
        if not rule or capability >= rule["capability"]:
            return self.defaults
        return self.defaults | {k: v for k, v in rule.items() if k not in ("capability", "read")}


TABLES = {"description", "defaults", "deepspeed", "plan", "methods", "model_code", "fsdp", "defaults_below_capability"}


def _check_keys(doc: dict, name: str) -> None:
    """A profile's tables and default knobs are ones memfit reads: a mistyped name is an error, not a silent default.
    The knob names come from the knob table's file itself (knobs.py imports this module's callers)."""
    for key in doc:
        if key not in TABLES:
            raise unknown_key(f"frameworks/{name}.toml", key, TABLES)
    for key in (*doc.get("defaults", {}), *(k for k in doc.get("defaults_below_capability", {})
                                            if k not in ("capability", "read"))):
        if key not in _knob_names():
            raise unknown_key(f"frameworks/{name}.toml [defaults]", key, _knob_names())


@cache
def _knob_names() -> frozenset[str]:
    with open(HERE / "knobs.toml", "rb") as f:
        return frozenset(tomllib.load(f)["knob"])


@cache
def frameworks() -> dict[str, Framework]:
    out = {}
    for path in sorted(FOLDER.glob("*.toml")):
        with open(path, "rb") as f:
            doc = tomllib.load(f)
        _check_keys(doc, path.stem)
        out[path.stem] = Framework(path.stem, doc["description"], doc["defaults"], doc["deepspeed"]["auto"],
                                   doc["plan"], doc["methods"], doc.get("model_code", {}), doc.get("fsdp", {}),
                                   doc.get("defaults_below_capability", {}))
    return out


def framework(name: str) -> Framework:
    table = frameworks()
    if name not in table:
        raise MemfitError(f"unknown framework profile {name!r}; choose one of: {', '.join(table)}")
    return table[name]


def model_code(profile: str) -> dict:
    """The profile's [model_code] facts: how its own model code saves and allocates ({} when it runs transformers')."""
    fw = frameworks().get(profile)
    return fw.model_code if fw else {}


def several_devices_dtypes(s) -> tuple[int, int] | None:
    """(bytes of a shard, bytes of a gathered parameter) under a framework's own several-device strategy in mixed
    precision, from its profile's [model_code.several_devices.mixed] (LitGPT: the model built in fp32, FSDP1's
    MixedPrecision gathering in bf16, lora.py's FSDP2 without a MixedPrecisionPolicy gathering the fp32 params); None
    where that does not apply (one device, another precision, a tuning or method the scripts do not run that way, a
    profile without the facts)."""
    several = model_code(s.profile).get("several_devices", {})
    mixed = several.get("mixed")
    # read for bf16-mixed (ModelParallelStrategy refuses 16-mixed), the scripts' supervised fine-tuning
    if not mixed or s.engine != "fsdp" or s.world_size < 2 or s.precision != "bf16-mixed" or s.method != "sft":
        return None
    size = {"fp32": 4, "bf16": 2}
    if s.tuning in several.get("flat_params", ()):
        return size[mixed["model_dtype"]], size[mixed["fsdp1_mixed_precision"]["param_dtype"]]
    if s.tuning in mixed["fsdp2"]:
        return size[mixed["model_dtype"]], size[mixed["fsdp2_param_dtype"]]
    return None


def autocast_over_fp32_gathers(s) -> bool:
    """The forward autocasts over parameters gathered in fp32 (LitGPT lora.py's FSDP2 under bf16-mixed): the module
    runs as plain torch autocast over an fp32 model does on one device."""
    dtypes = several_devices_dtypes(s)
    return bool(dtypes and dtypes[1] == 4 and model_code(s.profile)["several_devices"]["mixed"]["forward_autocast"])


def torchtune_builder(model) -> str:
    """The torchtune component builder that runs a catalog model (torchtune.models.<name>._component_builders): the
    one its model builders call for that checkpoint (memfit/trace/torchtune.py builds the model with it)."""
    mid = model.id.lower()
    if model.arch != "llama":
        return model.arch
    if "llama-2" in mid:
        return "llama2"
    if model.tie_embeddings:
        return "llama3_2"
    return "llama3_1" if "3.1" in mid else "llama3"
