"""Training methods and how each framework runs them (data/methods.toml): which models a run holds, how many
rows an example becomes, how log-probs are computed, and whether the reference model is a second copy.

The estimate (memfit/roles/), the step-time model, the trace and the real-engine measurement all read these
facts from here, so the trace's DPO step holds the reference the framework holds, not what the estimate
decided (docs/knobs.md C.3, C.4, E).
"""
from __future__ import annotations

import tomllib
from functools import cache

from memfit.errors import MemfitError
from memfit.facts.catalog import HERE
from memfit.facts.frameworks import framework


@cache
def facts() -> dict:
    with open(HERE / "methods.toml", "rb") as f:
        return tomllib.load(f)


def method_facts(method: str) -> dict:
    return facts()["method"][method]


def framework_facts(profile: str) -> dict:
    """How the framework runs preference / RL methods (data/frameworks/NAME.toml [methods])."""
    return framework(profile).methods


def run_methods(s) -> dict:
    """How this run's framework runs preference / RL methods: the profile's [methods], with what the releases the
    user named change (data/releases.toml; none named = the pinned releases, the profile as it is)."""
    fw = framework_facts(s.profile)
    if not s.releases:
        return fw
    from memfit.facts.releases import release_facts

    return fw | release_facts(s.profile, s.releases).methods


def logits_facts(kind: str) -> dict:
    return facts()["logits"][kind]


def generator_facts() -> dict:
    return facts()["generator"]["vllm"]


# the methods OpenRLHF's train_dpo runs (--ipo switches the loss): the DPO step the trace and measure run
OPENRLHF_DPO_METHODS = ("dpo", "ipo")


def several_models(method: str) -> bool:
    """The method runs more than the trained model (a reference, critic, reward model or generator), or trains
    on rows of several sequences per example."""
    return bool(method_facts(method).get("several"))


def reference(s) -> tuple[str, list[str]]:
    """The reference model this run holds: 'none', 'shared' (the policy with its adapters disabled, no copy) or
    'separate', with notes on what the framework does."""
    method, fw = method_facts(s.method), framework_facts(s.profile)
    if not method.get("reference") or (method.get("generator") and s.init_kl_coef == 0):
        return "none", []
    if s.precompute_ref_log_probs:
        if method.get("generator"):
            raise MemfitError("PPO/GRPO score fresh rollouts: reference log-probs cannot be precomputed; "
                              "drop --precompute-ref (or use --init-kl-coef 0 for no reference)")
        if not fw.get("precompute_ref"):
            raise MemfitError(f"profile {s.profile} cannot precompute reference log-probs (TRL's "
                              f"precompute_ref_log_probs); drop --precompute-ref or use --profile trl")
        return "none", ["reference log-probs precomputed before training: no reference model while training"]
    if s.uses_adapters and s.ref_model is None and fw.get("lora_ref") == "adapter-disable":
        return "shared", []
    if s.uses_adapters and fw.get("lora_ref") == "separate":
        return "separate", [f"{s.profile} loads a separate reference model even with LoRA"]
    return "separate", []
