"""PEFT adapters on the built model: LoRA / DoRA / QLoRA and the other methods of data/adapters.toml, built
with PEFT's own config classes so the trace runs PEFT's own layers."""
from __future__ import annotations

from contextlib import contextmanager
from typing import TypedDict

from memfit.errors import MemfitError
from memfit.facts.adapters import adapter_methods, method_info, wraps
from memfit.facts.catalog import ModelSpec, architectures
from memfit.facts.scenario import Scenario

# parameter and buffer names PEFT gives each method's tensors (peft/tuners/*/layer.py adapter_layer_names,
# other_param_names): they take the adapters' dtype
ADAPTER_PREFIXES = ("lora_", "ia3_", "vera_", "hada_", "lokr_", "oft_R", "boft_R", "boft_s", "prompt_encoder",
                    "ln_tuning_layers", "trainable_tokens_delta")


def is_adapter(name: str, scenario: Scenario) -> bool:
    return scenario.uses_adapters and any(prefix in name for prefix in ADAPTER_PREFIXES)


def lora_target_modules(spec: ModelSpec, built_family: str, targets: tuple[str, ...]) -> list[str] | str:
    """PEFT `target_modules` for the scenario's targets (module names, roles, or "all-linear")."""
    if "all-linear" in targets:
        return "all-linear"
    built_names = architectures().get(built_family, {}).get("linear_names") or spec.linear_names
    own_names = spec.linear_names or built_names
    roles: set[str] = set()
    names: list[str] = []
    for target in targets:
        if target in own_names:  # a module name of the catalog family: translate via its roles
            roles.update(own_names[target])
        elif target in built_names or target == "lm_head":
            names.append(target)
        else:
            roles.add(target)
    names += [name for name, name_roles in built_names.items() if roles & set(name_roles)]
    if not names:
        raise MemfitError(f"LoRA targets {list(targets)} match no linear layer of {spec.id} "
                          f"(modules: {', '.join(built_names)}; roles: q k v o gate up down fc proj)")
    return sorted(set(names))


def apply_lora(model, scenario: Scenario, family: str):
    from peft import LoraConfig, get_peft_model

    s = scenario
    config = LoraConfig(
        r=s.lora_rank,
        lora_alpha=s.lora_alpha if s.lora_alpha is not None else 2 * s.lora_rank,
        lora_dropout=s.lora_dropout,
        target_modules=lora_target_modules(s.model, family, s.lora_targets),
        use_dora=s.dora,
        task_type="CAUSAL_LM",
        modules_to_save=saved_module_names(model, s.modules_to_save) or None,
        trainable_token_indices=list(range(s.trainable_tokens)) or None,
    )
    return get_peft_model(model, config)



def _names(spec: ModelSpec, built_family: str, targets: tuple[str, ...]) -> list[str]:
    """Module names of the built model for the targets, "all-linear" spelled out (IA3 must name its
    feedforward modules among them)."""
    built = architectures().get(built_family, {}).get("linear_names") or spec.linear_names
    found = lora_target_modules(spec, built_family, targets)
    return sorted(built) if isinstance(found, str) else found


def _norm_names(model) -> list[str]:
    """The norm layers PEFT's LN tuning adapts: every *Norm module but the per-head q/k norms."""
    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if type(module).__name__.endswith("Norm")}
    return sorted(names - {"q_norm", "k_norm"})


def saved_module_names(model, wanted: tuple[str, ...]) -> list[str]:
    """PEFT modules_to_save names in the built model for memfit's embed_tokens / lm_head."""
    modules = {"embed_tokens": model.get_input_embeddings(), "lm_head": model.get_output_embeddings()}
    names = {id(m): n.rsplit(".", 1)[-1] for n, m in model.named_modules()}
    return [names[id(modules[w])] for w in wanted]


class _CommonArgs(TypedDict):
    """The arguments every targeted PEFT method's config takes alike."""
    target_modules: list[str]
    task_type: str
    modules_to_save: list[str] | None


def _config(s: Scenario, family: str, model):
    import peft

    if wraps(s.tuning) == "virtual_tokens":
        cls = peft.PromptTuningConfig if s.tuning == "prompt" else peft.PromptEncoderConfig
        return cls(num_virtual_tokens=s.virtual_tokens, task_type="CAUSAL_LM")
    if wraps(s.tuning) == "norms":
        return peft.LNTuningConfig(target_modules=_norm_names(model), task_type="CAUSAL_LM")
    if wraps(s.tuning) == "tokens":  # the first N rows: which rows does not change memory
        return peft.TrainableTokensConfig(token_indices=list(range(s.trainable_tokens)), task_type="CAUSAL_LM")
    info = method_info(s.tuning)
    names = _names(s.model, family, s.lora_targets)
    common = _CommonArgs(target_modules=names, task_type="CAUSAL_LM",
                         modules_to_save=saved_module_names(model, s.modules_to_save) or None)
    if s.tuning == "ia3":
        built = architectures().get(family, {}).get("linear_names") or s.model.linear_names
        ff = [n for n in names if set(built.get(n, [])) <= set(info["feedforward_roles"])]
        return peft.IA3Config(feedforward_modules=ff, **common)
    if s.tuning == "adalora":  # PEFT requires the schedule's length; it does not change memory
        return peft.AdaLoraConfig(init_r=s.lora_rank, target_r=max(1, s.lora_rank // 2), total_step=1000,
                                  lora_dropout=s.lora_dropout, **common)
    if s.tuning == "vera":
        return peft.VeraConfig(r=s.lora_rank, vera_dropout=s.lora_dropout, **common)
    if s.tuning == "oft":  # PEFT's default blocks of 32 (facts/peft_shapes.py); its r counts blocks
        return peft.OFTConfig(**common)
    if s.tuning == "boft":  # PEFT's default blocks of 4, one butterfly factor (facts/peft_shapes.py)
        return peft.BOFTConfig(**common)
    return getattr(peft, info["peft"])(r=s.lora_rank, **common)


def apply_peft(model, scenario: Scenario, family: str):
    """The scenario's PEFT method on the built model."""
    from peft import get_peft_model

    if scenario.tuning not in adapter_methods():
        return apply_lora(model, scenario, family)
    if "peft" not in method_info(scenario.tuning):  # a framework's own method (LitGPT's LLaMA-Adapter)
        raise MemfitError(f"--tuning {scenario.tuning} runs LitGPT's own model code, which this trace (transformers' "
                          "code) does not run: trace it in LitGPT's venv with python -m memfit.trace.litgpt")
    with _shaped_permutations(scenario.tuning == "boft"):
        model = get_peft_model(model, _config(scenario, family, model))
    if scenario.tuning in ("loha", "lokr"):
        _always_keep_modules(model)
    return model


@contextmanager
def _shaped_permutations(wanted: bool):
    """BOFT fills its I x I permutation buffer entry by entry (boft/layer.py perm2mat), reading each index's value,
    which a meta tensor does not have. The trace needs its shape and dtype only: an empty (I, I) fp32 matrix, as
    perm2mat's own torch.zeros((n, n)) makes it."""
    if not wanted:
        yield
        return
    import torch
    from peft.tuners.boft.layer import BOFTLayer

    original = BOFTLayer.perm2mat
    # a class's method patched for the trace (mypy refuses method assignment), PEFT's own put back below
    BOFTLayer.perm2mat = lambda self, indices: torch.zeros((len(indices), len(indices)))  # type: ignore[method-assign]
    try:
        yield
    finally:
        BOFTLayer.perm2mat = original  # type: ignore[method-assign]


class _AlwaysKept:
    """A module_dropout of 0 that a fake tensor can be compared with: LoHa (and LoKr) draws `torch.rand(1) > p` each
    forward to skip the adapter, and a fake tensor has no value to branch on. With p = 0 the draw always
    keeps the adapter; `rand > _AlwaysKept()` falls back to this __lt__ and says so without a value."""

    def __lt__(self, other) -> bool:
        return True


def _always_keep_modules(model) -> None:
    for module in model.modules():
        drops = getattr(module, "module_dropout", None)
        if isinstance(drops, dict):
            for name, p in drops.items():
                if p == 0:
                    drops[name] = _AlwaysKept()
