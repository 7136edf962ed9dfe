"""`estimate(s)`: per-GPU and host memory of any run, as one `Estimate`.

A run is split into roles (the trained policy; for preference / RL methods also a reference, critic, reward
model, vLLM generator), each role placed in processes and GPU groups the way its framework does
(data/placements.toml names the placement of each framework and method): one training process per GPU
(one_process.py: SFT, pre-training, DPO and its relatives, reward models) or an RL framework's declared workers
(placement.py turns a declaration into GPU groups; openrlhf.py: PPO, GRPO, and the layout of a framework without
its own; verl.py: verl's hybrid engine). The Estimate's top-level profiles are the worst GPU group's; a single-model
run is one role in one group.
"""
from __future__ import annotations

from memfit.facts.assumptions import Assumption, from_source
from memfit.facts.catalog import ModelSpec
from memfit.facts.error_bands import band_of
from memfit.facts.methods import method_facts, run_methods, several_models
from memfit.facts.placements import placement_for
from memfit.facts.scenario import Scenario
from memfit.memory.inventory import count_params
from memfit.memory.phases import verdict_of
from memfit.memory.remote_code import notes as remote_code_notes
from memfit.roles import one_process, openrlhf, placement, verl
from memfit.roles.result import Estimate, Placement


def _declared(module):
    """A framework's declaration module as a placement: declare, then the generic placement."""
    return lambda s, notes: placement.place(module.declare(s, notes))


# data/placements.toml row name -> the code that places it (tests/test_placements.py: every row has one)
DECLARATIONS = {"one_process": one_process.place, "openrlhf": _declared(openrlhf), "verl": _declared(verl)}


def place(s: Scenario, notes: list[str]) -> Placement:
    return DECLARATIONS[placement_for(s.profile, s.method).name](s, notes)


def estimate(s: Scenario) -> Estimate:
    notes: list[str] = []
    placement = place(s, notes)
    s = placement.scenario or s  # the run as its framework runs it (verl trains under FSDP whatever was said)
    worst = min(placement.groups, key=lambda g: g.margin_bytes)
    host = placement.host
    host_margin = None if s.hardware.host_ram is None else s.hardware.host_ram - host.peak.total
    band = band_of(s)
    fraction = band.fraction_at(worst.peak)
    verdict = verdict_of(worst.margin_bytes, s.hardware.gpu.memory_bytes, host_margin, fraction)
    return Estimate(
        scenario=s, total_params=placement.total_params, trainable_params=placement.trainable_params,
        allocated=worst.allocated, reserved=worst.reserved, device_total=worst.device_total, host=host,
        verdict=at_most_tight(verdict, s.unread),
        margin_bytes=worst.margin_bytes, host_margin_bytes=host_margin, roles=placement.roles,
        groups=placement.groups, worst_group=worst.name, drivers=placement.drivers,
        gpus_needed=placement.gpus_needed, band_kind=band.kind, band_fraction=fraction,
        oom_chance=band.oom_chance(worst.margin_bytes, worst.peak),
        assumptions=from_source(_method_assumptions(s), "method") + from_source(_model_assumptions(s.model), "catalog")
        + from_source(_kernel_assumptions(s), "catalog") + from_source(s.assumed, "config")
        + from_source(notes + placement.notes, "method") + [Assumption(band.describe(worst.peak), "memfit")]
        + from_source(_unread_assumptions(s.unread), "config") + from_source(_paged_assumptions(worst), "memfit"))


def _paged_assumptions(group) -> list[str]:
    if not group.evictable:
        return []
    gib = group.evictable / 2**30
    return [f"paged optimizer states ({gib:.2f} GiB) are CUDA unified memory (bitsandbytes functional.py get_paged: "
            f"cudaMallocManaged): the driver pages them out to host RAM when the card fills instead of running out "
            f"of memory, so the margin leaves them out; each step that does moves them over PCIe"]


def at_most_tight(verdict: str, unread: tuple[str, ...]) -> str:
    """A run with a memory-relevant setting memfit could not read is not the run it estimated: never "fits"."""
    return "tight" if unread and verdict == "fits" else verdict


def _unread_assumptions(unread: tuple[str, ...]) -> list[str]:
    return [f"not read: {what}; the estimate is of the run without it, so the verdict is at most 'tight'"
            for what in unread]


def _kernel_assumptions(s: Scenario) -> list[str]:
    if remote_code_notes(s):  # a hub remote-code family traced on its own modeling file
        return remote_code_notes(s)
    if s.attention == "sdpa" and s.model.sdpa_math:
        return ["SDPA runs torch's math kernel (fp32 scores per head kept for backward): transformers' modeling code "
                "hands it k/v heads the fused kernels refuse (traced); a framework with its own model code may not"]
    return []


def _method_assumptions(s: Scenario) -> list[str]:
    """What a several-model estimate rests on: the method's models and the framework's log-prob handling."""
    if not several_models(s.method):
        return []
    fw = run_methods(s)
    return [f"method {s.method}: {method_facts(s.method)['description']}", f"framework facts: {fw['source']}",
            f"log-probs computed as '{fw['logits']}' (data/methods.toml); the --loss setting does not apply"]


def _model_assumptions(model: ModelSpec) -> list[str]:
    """What memfit guessed reading the model's config.json, and a checkpoint whose parameter count is not memfit's."""
    notes = list(model.assumed)
    # a quantized checkpoint stores packed integers and scales: its element count is not a parameter count
    if model.hub_param_count is not None and model.quantization is None:
        ours = count_params(model)
        if ours != model.hub_param_count:
            notes.append(f"parameters: {ours:,} counted from config.json, but the checkpoint's safetensors hold "
                         f"{model.hub_param_count:,} ({model.hub_param_count / ours - 1:+.1%}); the estimate uses "
                         f"memfit's count (a tied lm_head saved anyway or a vision tower explain some differences)")
    return notes
