"""Every parameter tensor of a model, with shape facts, owning module, and trainability.

Tensors that repeat in each decoder layer are listed once with `count = num_layers`, so the whole
inventory of a 70B model is a few dozen rows. Trainability and LoRA adapters come from the tuning.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from memfit.errors import MemfitError
from memfit.facts.adapters import elements_of, facts_for, method_info, wraps
from memfit.facts.frameworks import model_code
from memfit.facts.peft_shapes import layer_sizes
from memfit.facts.releases import expert_lora
from memfit.facts.catalog import ModelSpec
from memfit.facts.scenario import Scenario

# Which roles a Linear computes and its (in, out) widths; fused modules sum the outputs.
ATTENTION_ROLES = ("q", "k", "v", "o")
MLP_ROLES = ("gate", "up", "down", "fc", "proj")


@dataclass(frozen=True)
class ParamTensor:
    name: str
    numel: int
    count: int = 1  # identical tensors, e.g. one per decoder layer
    kind: str = "linear"  # linear | bias | norm | embedding | lm_head | router | lora (any PEFT adapter)
    module: str = ""  # the module the tensor belongs to (LoRA target names refer to it)
    in_features: int = 0
    out_features: int = 0
    per_layer: bool = False
    trainable: bool = True
    quantized: bool = False  # stored 4-bit (QLoRA or a GPTQ checkpoint)
    layer_index: int | None = None  # set by freeze tuning: which layers train
    element_bytes: int = 0  # a frozen buffer whose dtype no cast decides (BOFT's fp32 permutations); 0: by kind

    @property
    def total(self) -> int:
        return self.numel * self.count


def _role_width(model: ModelSpec, role: str, ffn: int) -> tuple[int, int]:
    h, d = model.hidden_size, model.head_dim
    return {
        "q": (h, model.num_heads * d),
        "k": (h, model.num_kv_heads * d),
        "v": (h, model.num_kv_heads * d),
        "o": (model.num_heads * d, h),
        "gate": (h, ffn),
        "up": (h, ffn),
        "fc": (h, ffn),
        "down": (ffn, h),
        "proj": (ffn, h),
    }[role]


def _bias_for(model: ModelSpec, roles: list[str]) -> bool:
    if set(roles) <= {"q", "k", "v"}:
        return model.qkv_bias
    if roles == ["o"]:
        return model.o_bias
    return model.mlp_bias


def _linears(model: ModelSpec, names: dict, roles_wanted: tuple[str, ...], ffn: int, prefix: str,
             count: int) -> list[ParamTensor]:
    out = []
    excluded = {"fc", "proj"} if model.mlp == "gated" else {"gate", "up"}
    for module, roles in names.items():
        if not set(roles) <= set(roles_wanted) or set(roles) & excluded:
            continue
        widths = [_role_width(model, r, ffn) for r in roles]
        fan_in = widths[0][0]
        fan_out = sum(w[1] for w in widths)
        out.append(ParamTensor(f"{prefix}{module}.weight", fan_in * fan_out, count, "linear", module,
                               fan_in, fan_out, per_layer=True))
        if _bias_for(model, list(roles)):
            out.append(ParamTensor(f"{prefix}{module}.bias", fan_out, count, "bias", module, per_layer=True))
    return out


def _norm_tensors(model: ModelSpec, name: str, width: int, count: int, per_layer: bool) -> list[ParamTensor]:
    if model.norm == "none":
        return []
    tensors = [ParamTensor(f"{name}.weight", width, count, "norm", name.split(".")[-1], per_layer=per_layer)]
    if model.norm == "layer":
        tensors.append(ParamTensor(f"{name}.bias", width, count, "norm", name.split(".")[-1], per_layer=per_layer))
    return tensors


def _layer_tensors(model: ModelSpec, count: int, prefix: str = "layers.*.") -> list[ParamTensor]:
    names = model.linear_names
    h, d = model.hidden_size, model.head_dim
    tensors = _linears(model, names, ATTENTION_ROLES, model.intermediate_size, prefix + "attn.", count)
    if model.is_moe:
        experts = count * model.num_experts
        ffn = model.moe_intermediate_size or model.intermediate_size
        tensors += _linears(model, names, MLP_ROLES, ffn, prefix + "experts.*.", experts)
        tensors.append(ParamTensor(prefix + "router.weight", h * model.num_experts, count, "router", "gate",
                                   h, model.num_experts, per_layer=True))
        if model.shared_expert_intermediate_size:
            tensors += _linears(model, names, MLP_ROLES, model.shared_expert_intermediate_size,
                                prefix + "shared_expert.", count)
            if model.extra.get("shared_expert_gate"):
                tensors.append(ParamTensor(prefix + "shared_expert_gate.weight", h, count, "router",
                                           "shared_expert_gate", h, 1, per_layer=True))
    else:
        tensors += _linears(model, names, MLP_ROLES, model.intermediate_size, prefix + "mlp.", count)
    for i in range(model.norms_per_layer):
        tensors += _norm_tensors(model, f"{prefix}norm{i}", h, count, True)
    if model.qk_norm == "head":
        tensors += [ParamTensor(prefix + "q_norm.weight", d, count, "norm", "q_norm", per_layer=True),
                    ParamTensor(prefix + "k_norm.weight", d, count, "norm", "k_norm", per_layer=True)]
    elif model.qk_norm == "full":
        tensors += [ParamTensor(prefix + "q_norm.weight", model.num_heads * d, count, "norm", "q_norm", per_layer=True),
                    ParamTensor(prefix + "k_norm.weight", model.num_kv_heads * d, count, "norm", "k_norm",
                                per_layer=True)]
    return tensors


def _encoder_decoder_tensors(model: ModelSpec) -> list[ParamTensor]:
    """T5-style: encoder layers (self-attn + FFN, 2 norms), decoder layers (+ cross-attn, 3 norms)."""
    extra = model.extra
    dec_layers = extra.get("num_decoder_layers", model.num_layers)
    buckets = extra.get("relative_attention_num_buckets", 32)
    h = model.hidden_size
    enc = _linears(model, model.linear_names, ATTENTION_ROLES + MLP_ROLES, model.intermediate_size,
                   "encoder.*.", model.num_layers)
    enc += _norm_tensors(model, "encoder.*.norm", h, 2 * model.num_layers, True)
    dec = _linears(model, model.linear_names, ATTENTION_ROLES, model.intermediate_size, "decoder.*.cross.",
                   dec_layers)
    dec += _linears(model, model.linear_names, ATTENTION_ROLES + MLP_ROLES, model.intermediate_size,
                    "decoder.*.", dec_layers)
    dec += _norm_tensors(model, "decoder.*.norm", h, 3 * dec_layers, True)
    rel = [ParamTensor(f"{side}.relative_attention_bias", buckets * model.num_heads, 1, "embedding", side)
           for side in ("encoder", "decoder")]
    finals = _norm_tensors(model, "encoder.final_norm", h, 1, False) + _norm_tensors(model, "decoder.final_norm",
                                                                                     h, 1, False)
    return enc + dec + rel + finals


def base_tensors(model: ModelSpec) -> list[ParamTensor]:
    """All parameters of the pretrained model, every one marked trainable (full fine-tuning)."""
    h, v = model.hidden_size, model.vocab_size
    tensors = [ParamTensor("embed_tokens.weight", v * h, 1, "embedding", "embed_tokens", h, v)]
    if model.position == "learned":
        if not model.max_position_embeddings:
            raise MemfitError(f"{model.id}: learned positions need max_position_embeddings")
        rows = model.max_position_embeddings + model.learned_position_offset
        tensors.append(ParamTensor("embed_positions.weight", rows * h, 1, "embedding",
                                   "embed_positions"))
    if model.embedding_norm:
        tensors += _norm_tensors(model, "embed_norm", h, 1, False)
    if model.encoder_decoder:
        tensors += _encoder_decoder_tensors(model)
    elif model.attention == "mla":  # DeepSeek-V2/V3: latent attention, dense-first layers, shared experts
        tensors += mla_layer_tensors(model)
        tensors += _norm_tensors(model, "final_norm", h, 1, False)
    else:
        tensors += _layer_tensors(model, model.num_layers)
        if model.final_norm:
            tensors += _norm_tensors(model, "final_norm", h, 1, False)
    if not model.tie_embeddings:
        tensors.append(ParamTensor("lm_head.weight", v * h, 1, "lm_head", "lm_head", h, v))
    if model.lm_head_bias:
        tensors.append(ParamTensor("lm_head.bias", v, 1, "bias", "lm_head"))
    return tensors


def count_params(model: ModelSpec) -> int:
    return sum(t.total for t in base_tensors(model))


def _targeted(t: ParamTensor, targets: tuple[str, ...], model: ModelSpec) -> bool:
    if t.kind != "linear":
        return t.kind == "lm_head" and "lm_head" in targets
    if "all-linear" in targets or "all" in targets:
        return True  # PEFT's all-linear: every Linear except the output head
    roles = model.linear_names.get(t.module, [])
    # PEFT matches a target by the module name's tail: "c_proj" adapts both attn.c_proj and mlp.c_proj
    return any(t.module == x or t.module.endswith("." + x) for x in targets) or any(r in targets for r in roles)


def _lora_adapts(t: ParamTensor, targets: tuple[str, ...], model: ModelSpec, experts: str) -> bool:
    """Whether PEFT LoRA adapts this base tensor; `experts` is what it does with the routed experts
    (facts/releases.py expert_lora: "linear", "fused" or "none")."""
    if t.kind == "router":  # an nn.Linear, save transformers 5's stacked families' router (a module of its own)
        named = bool({"all-linear", "all", t.module} & set(targets))
        return named and not (experts == "none" and t.module == "gate")
    if ".experts." in t.name and experts == "none":
        return False
    if experts == "fused" and ".experts." not in t.name and set(model.linear_names.get(t.module, ())) & {"gate", "up",
                                                                                                           "down"}:
        return False  # PEFT turned these names into the stacked experts' target_parameters
    return _targeted(t, targets, model)


def _stacked_rank(t: ParamTensor, adapted: list[ParamTensor], model: ModelSpec, rank: int, dora: bool) -> int:
    """lora_B's rank of a routed expert's projection under PEFT's target_parameters (lora.ParamWrapper): the
    gate and up projections are one gate_up_proj parameter, whose LoRA has rank 2r (A: 2r x H, B: 2F x 2r)."""
    roles = {r for a in adapted if ".experts." in a.name for r in model.linear_names.get(a.module, ())}
    if dora:
        raise MemfitError(f"PEFT refuses DoRA on {model.id}'s stacked experts (lora.ParamWrapper): leave the "
                          "experts out of the targets")
    if ("gate" in roles) != ("up" in roles):
        raise MemfitError(f"{model.id} stores its experts' gate and up projections as one gate_up_proj: PEFT "
                          "refuses to target one without the other")
    return 2 * rank if set(model.linear_names.get(t.module, ())) & {"gate", "up"} else rank


def lora_tensors(model: ModelSpec, tensors: list[ParamTensor], rank: int, targets: tuple[str, ...],
                 dora: bool, experts: str = "linear") -> list[ParamTensor]:
    """PEFT LoRA: A (rank x in) and B (out x rank) per adapted Linear; DoRA adds a magnitude vector."""
    adapted = [t for t in tensors if _lora_adapts(t, targets, model, experts)]
    adapters = []
    for t in adapted:
        b_rank = _stacked_rank(t, adapted, model, rank, dora) if experts == "fused" and ".experts." in t.name \
            else rank
        adapters.append(ParamTensor(f"{t.name}.lora_A", rank * t.in_features, t.count, "lora", t.module,
                                    t.in_features, rank, t.per_layer))
        adapters.append(ParamTensor(f"{t.name}.lora_B", b_rank * t.out_features, t.count, "lora", t.module,
                                    b_rank, t.out_features, t.per_layer))
        if dora:
            adapters.append(ParamTensor(f"{t.name}.lora_magnitude", t.out_features, t.count, "lora", t.module,
                                        per_layer=t.per_layer))
    if not adapters:
        valid = sorted(set(model.linear_names) | {"all-linear", "lm_head"})
        raise MemfitError(f"LoRA targets {list(targets)} match no module of {model.id}; valid: {', '.join(valid)}")
    return adapters


def feedforward(model: ModelSpec, method: str, module: str) -> bool:
    """IA3 scales the input of the MLP's output Linear, the output of the others (PEFT feedforward_modules)."""
    roles = method_info(method).get("feedforward_roles", [])
    return bool(roles) and set(model.linear_names.get(module, [])) <= set(roles)


def peft_tensors(model: ModelSpec, tensors: list[ParamTensor], method: str, rank: int,
                 targets: tuple[str, ...]) -> list[ParamTensor]:
    """Another PEFT method: per adapted Linear the trainable tensors of data/peft.toml, named `<linear>.adapter`
    with the Linear's widths; its frozen tensors once per model when the method shares them (VeRA).
    transformers' fused MoE experts are not nn.Linear modules, so PEFT leaves them alone."""
    adapted = [t for t in tensors if ".experts." not in t.name and _targeted(t, targets, model)]
    if not adapted:
        valid = sorted(set(model.linear_names) | {"all-linear"})
        raise MemfitError(f"{method} targets {list(targets)} match no module of {model.id}; valid: {', '.join(valid)}")
    out = []
    for t in adapted:
        sizes = layer_sizes(method, t.in_features, t.out_features, rank)
        facts = facts_for(method, "fp32", feedforward(model, method, t.module), sizes)
        out.append(ParamTensor(f"{t.name}.adapter", elements_of(facts["trainable"], sizes), t.count, "lora", t.module,
                               t.in_features, t.out_features, t.per_layer))
    if method_info(method).get("frozen_per_linear"):
        out += _frozen_per_linear(method, adapted, rank)
    if method_info(method).get("shared_frozen"):
        widest = {"I": max(t.in_features for t in adapted), "O": max(t.out_features for t in adapted), "R": rank}
        out.append(ParamTensor(f"{method}.shared", elements_of(facts_for(method, "fp32")["frozen"], widest), 1, "lora",
                               method, trainable=False))
    return out


def _frozen_per_linear(method: str, adapted: list[ParamTensor], rank: int) -> list[ParamTensor]:
    """The frozen tensors of data/peft.toml beside each adapted Linear, in the dtype PEFT made them (one term
    each: BOFT's I x I fp32 permutation buffer)."""
    out = []
    for t in adapted:
        sizes = layer_sizes(method, t.in_features, t.out_features, rank)
        for i, (term, nbytes) in enumerate(facts_for(method, "fp32", sizes=sizes)["frozen"]):
            out.append(ParamTensor(f"{t.name}.adapter_buffer{i}", elements_of([(term, nbytes)], sizes), t.count, "lora",
                                   t.module, per_layer=t.per_layer, trainable=False, element_bytes=nbytes))
    return out


def prompt_tensors(model: ModelSpec, method: str, virtual_tokens: int) -> list[ParamTensor]:
    """Prompt tuning: the virtual tokens' embedding; p-tuning: the same through an MLP of three Linears with
    biases, as wide as the model (PEFT PromptEncoder, encoder_hidden_size = hidden by default)."""
    h = model.hidden_size
    out = [ParamTensor("prompt_encoder.embedding.weight", virtual_tokens * h, 1, "lora", "prompt_encoder")]
    if method == "ptuning":
        out.append(ParamTensor("prompt_encoder.mlp", 3 * (h * h + h), 1, "lora", "prompt_encoder"))
    return out


def token_rows(model: ModelSpec, rows: int) -> list[ParamTensor]:
    """PEFT trainable tokens (data/peft.toml [trainable_tokens]): the trained rows beside a frozen buffer of their
    originals, once per model (a tied head's layer shares the embedding's)."""
    if not rows:
        return []
    facts, sizes = facts_for("trainable_tokens", "fp32"), {"N": rows, "H": model.hidden_size}
    return [ParamTensor("embed_tokens.trainable_tokens_delta", elements_of(facts["trainable"], sizes), 1, "lora",
                        "embed_tokens"),
            ParamTensor("embed_tokens.trainable_tokens_original", elements_of(facts["frozen"], sizes), 1, "embedding",
                        "embed_tokens", trainable=False)]


def norm_copies(tensors: list[ParamTensor]) -> list[ParamTensor]:
    """LN tuning: every norm layer frozen, beside a trainable copy (PEFT LNTuningLayer); the per-head q/k norms
    are not among PEFT's targets."""
    frozen = [replace(t, trainable=False) for t in tensors]
    copies = [replace(t, name=f"{t.name}.ln_tuning") for t in tensors
              if t.kind == "norm" and t.module not in ("q_norm", "k_norm")]
    return frozen + copies


def _freeze_split(tensors: list[ParamTensor], model: ModelSpec, trainable_layers: int) -> list[ParamTensor]:
    """Freeze tuning (LLaMA-Factory): only the last `trainable_layers` decoder layers train."""
    if not 0 < trainable_layers <= model.num_layers:
        raise MemfitError(f"freeze tuning: trainable layers must be in 1..{model.num_layers}, got {trainable_layers}")
    out = []
    for t in tensors:
        if not t.per_layer:
            out.append(replace(t, trainable=False))
            continue
        frozen = t.count * (model.num_layers - trainable_layers) // model.num_layers
        out.append(replace(t, count=frozen, trainable=False))
        out.append(replace(t, count=t.count - frozen, trainable=True))
    return [t for t in out if t.count]


def tuned_tensors(model: ModelSpec, tuning: str, rank: int = 8, targets: tuple[str, ...] = ("all-linear",),
                  dora: bool = False, trainable_layers: int = 2, virtual_tokens: int = 20,
                  releases: tuple = ()) -> list[ParamTensor]:
    """The inventory after applying the tuning method: frozen base, trainable parts, adapters (LoRA on a MoE's
    experts as the given framework `releases`, else the pinned ones, store them)."""
    tensors = base_tensors(model)
    if tuning == "full":
        return tensors
    if tuning == "freeze":
        return _freeze_split(tensors, model, trainable_layers)
    quantize = tuning == "qlora" or model.quantization is not None
    frozen = [replace(t, trainable=False, quantized=quantize and t.kind == "linear" and t.per_layer)
              for t in tensors]
    if wraps(tuning) == "norms":
        return norm_copies(tensors)
    if wraps(tuning) == "virtual_tokens":
        return frozen + prompt_tensors(model, tuning, virtual_tokens)
    if wraps(tuning) in ("tokens", "prompt_attention"):  # scenario_tensors adds them (the rows; the framework's)
        return frozen
    if wraps(tuning) == "linear":
        return frozen + peft_tensors(model, tensors, tuning, rank, targets)
    experts = expert_lora(model.arch, releases) if model.is_moe else "linear"
    return frozen + lora_tensors(model, tensors, rank, targets, dora, experts)


def saved_copies(model: ModelSpec, tensors: list[ParamTensor], modules: tuple[str, ...]) -> list[ParamTensor]:
    """PEFT modules_to_save: a trainable copy of each named module beside its frozen original. A head tied to the
    embedding is copied from the embedding's weight, and the copy is not tied to anything."""
    out = []
    for name in modules:
        tied_head = name == "lm_head" and model.tie_embeddings
        source = "embed_tokens" if tied_head else name
        out += [replace(t, name=f"{name}.modules_to_save.{t.name}", module=name, trainable=True,
                        kind="lm_head" if name == "lm_head" and t.kind == "embedding" else t.kind)
                for t in tensors if t.module == source and t.kind in ("embedding", "lm_head", "bias")]
    return out


TRAINED_NORMS = ("norm0", "norm1", "final_norm")  # LitGPT adapter_filter: norm_1, norm_2, ln_f


def prompt_adapter(s: Scenario) -> dict:
    """The [model_code.<tuning>] facts of a framework's own LLaMA-Adapter ({} under any other tuning)."""
    return model_code(s.profile).get(s.tuning, {}) if wraps(s.tuning) == "prompt_attention" else {}


def prompt_adapter_tensors(s: Scenario, frozen: list[ParamTensor]) -> list[ParamTensor]:
    """LitGPT's LLaMA-Adapter (adapter.py / adapter_v2.py): a prompt and per-head gates in every layer from the
    start layer on; v2 adds a scale and a bias to every Linear's output (the head's too) and trains the norms."""
    code, m = prompt_adapter(s), s.model
    prompted = max(m.num_layers - code["start_layer"], 0)
    out = [replace(t, trainable=True) if code["trains_norms"] and t.module in TRAINED_NORMS else t for t in frozen]
    out += [ParamTensor("attn.adapter_wte.weight", code["prompt_length"] * m.hidden_size, prompted, "lora",
                        "adapter_wte", per_layer=True, trainable=code["prompt_trains"]),
            ParamTensor("attn.gating_factor", m.num_heads, prompted, "lora", "gating_factor", per_layer=True)]
    if code["scaled_linears"]:
        out += [ParamTensor(t.name.replace(".weight", ".adapter_scale_bias"), 2 * t.out_features, t.count, "lora",
                            t.module, per_layer=t.per_layer) for t in frozen if t.kind in ("linear", "lm_head", "router")]
    return [t for t in out if t.count]


def scenario_tensors(s: Scenario) -> list[ParamTensor]:
    """The inventory of a scenario's model under its tuning."""
    tensors = tuned_tensors(s.model, s.tuning, s.lora_rank, s.lora_targets, s.dora, s.freeze_trainable_layers,
                            s.virtual_tokens, s.releases)
    if wraps(s.tuning) == "prompt_attention":
        tensors = prompt_adapter_tensors(s, tensors)
    if not s.uses_adapters:
        return tensors
    return tensors + saved_copies(s.model, tensors, s.modules_to_save) + token_rows(s.model, s.trainable_tokens)


# ---------------------------------------------------------------------------------------------- MLA
# DeepSeek-V2 / V3 decoder layers: multi-head latent attention, the first `first_k_dense_replace` layers dense, the
# rest MoE with shared experts. Source: transformers models/deepseek_v3/modeling_deepseek_v3.py (DeepseekV3Attention,
# DeepseekV3MoE, DeepseekV3TopkRouter; V2 is the same parameter layout). Keys beyond ModelSpec live in `model.extra`.
def _mla_attention(model: ModelSpec, count: int, prefix: str) -> list[ParamTensor]:
    x = model.extra
    h, heads = model.hidden_size, model.num_heads
    rope, nope, v = x["qk_rope_head_dim"], x["qk_nope_head_dim"], x["v_head_dim"]
    q_rank, kv_rank = x.get("q_lora_rank") or 0, x["kv_lora_rank"]
    out: list[ParamTensor] = []

    def linear(name: str, fan_in: int, fan_out: int, bias: bool = False) -> None:
        out.append(ParamTensor(f"{prefix}{name}.weight", fan_in * fan_out, count, "linear", name, fan_in, fan_out,
                               per_layer=True))
        if bias:
            out.append(ParamTensor(f"{prefix}{name}.bias", fan_out, count, "bias", name, per_layer=True))

    if q_rank:
        linear("q_a_proj", h, q_rank, model.qkv_bias)
        out.append(ParamTensor(f"{prefix}q_a_layernorm.weight", q_rank, count, "norm", "q_a_layernorm", per_layer=True))
        linear("q_b_proj", q_rank, heads * (nope + rope))
    else:
        linear("q_proj", h, heads * (nope + rope))
    linear("kv_a_proj_with_mqa", h, kv_rank + rope, model.qkv_bias)
    out.append(ParamTensor(f"{prefix}kv_a_layernorm.weight", kv_rank, count, "norm", "kv_a_layernorm", per_layer=True))
    linear("kv_b_proj", kv_rank, heads * (nope + v))
    linear("o_proj", heads * v, h, model.o_bias)
    return out


def mla_layer_tensors(model: ModelSpec) -> list[ParamTensor]:
    """Every decoder layer of a DeepSeek-V2/V3 model (attention = "mla")."""
    layers, h, x = model.num_layers, model.hidden_size, model.extra
    dense = min(x.get("first_k_dense_replace", 0), layers) if model.is_moe else layers
    moe = layers - dense
    names = model.linear_names
    tensors = _mla_attention(model, layers, "layers.*.attn.")
    if dense:
        tensors += _linears(model, names, MLP_ROLES, model.intermediate_size, "dense_layers.*.mlp.", dense)
    if moe:
        ffn = model.moe_intermediate_size or model.intermediate_size
        tensors += _linears(model, names, MLP_ROLES, ffn, "moe_layers.*.experts.*.", moe * model.num_experts)
        tensors.append(ParamTensor("moe_layers.*.router.weight", h * model.num_experts, moe, "router", "gate", h,
                                   model.num_experts, per_layer=True))
        shared = model.shared_expert_intermediate_size or x.get("n_shared_experts", 0) * ffn
        if shared:
            tensors += _linears(model, names, MLP_ROLES, shared, "moe_layers.*.shared_experts.", moe)
    for i in range(model.norms_per_layer):
        tensors += _norm_tensors(model, f"layers.*.norm{i}", h, layers, True)
    return tensors
