"""Activation and logits/loss bytes of one micro-batch, from what the HF modeling code saves for backward.

Source: docs/knobs.md C (read from transformers' modeling_llama.py, sdpa_attention.py,
masking_utils.py, loss_utils.py; TRL's chunked loss; Liger's fused linear cross entropy), D (PEFT).
Every term is "bytes per token" (or per token x key for attention scores) times the token count.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from memfit.facts.adapters import bytes_of, facts_for, setup_name, wraps
from memfit.facts.peft_shapes import layer_sizes
from memfit.facts.activation_table import activation_fp32_output, activation_saved, activation_saves_output
from memfit.facts.engines import engine_of
from memfit.facts.frameworks import model_code
from memfit.facts.loss_tail import loss_tail, transformers_release
from memfit.facts.recompute import Recompute
from memfit.memory.own_code import (code_logits, fused_qkv, fused_qkv_rest, prompt_layer_extra, prompt_layers,
                                    scaled_head)
from memfit.memory.int8_base import outlier_bytes
from memfit.memory.eager_attention import attention_backward_per_key, eager_kernel, layer_backward_transient
from memfit.memory.remote_code import adjusted as remote_code_adjusted
from memfit.memory.inventory import ParamTensor, feedforward, prompt_adapter
from memfit.memory.unsloth_loss import loss_terms as unsloth_loss_terms
from memfit.memory.unsloth_offload import unsloth_offload
from memfit.facts.scenario import Scenario

LIGER_CHUNK_ROUND = 2  # chunk rows are rounded to a power of two: at most 2x n_tok*h logits per chunk
TRL_CHUNK_TOKENS = 256  # trl sft_trainer _CHUNKED_LM_HEAD_CHUNK_SIZE
TORCHTUNE_CHUNKS = 8  # torchtune CEWithChunkedOutputLoss num_output_chunks

Triple = tuple[int, int, int]  # _logits' three byte counts; a measured row (model_code, loss_tail) holds three


@dataclass
class Activations:
    """Bytes of activations for one micro-batch on one rank."""

    layer_saved: int  # what one un-checkpointed decoder layer keeps for backward
    layer_checkpoint: int  # what one checkpointed layer keeps (its input)
    checkpointed_layers: int
    plain_layers: int
    outside_layers: int  # saved by embedding, final norm, lm_head input
    shared_masks: int  # attention masks built once per forward and shared by the layers
    layer_forward_transient: int  # peak temporaries inside one layer's forward
    layer_backward_transient: int  # gradient temporaries while one layer runs backward
    logits_forward_peak: int
    logits_saved: int
    logits_backward_peak: int
    logits_grad: int = 0  # the logits' gradient in their own dtype, alive while the head computes its grads
    host_offloaded: int = 0  # checkpoints kept in host RAM (offloaded / unsloth checkpointing)
    embedding_transient: int = 0  # PEFT trainable tokens: the embedding's merged V x H weight (forward) or its gradient
    logits_kept: int = 0  # a framework loop's own reference to the logits, alive across steps (own_code.py)

    @property
    def saved_total(self) -> int:
        return (self.layer_saved * self.plain_layers + self.layer_checkpoint * self.checkpointed_layers
                + self.outside_layers + self.shared_masks)

    @property
    def output_grad(self) -> int:
        """The gradient of one layer's output, alive while that layer runs its backward."""
        return self.layer_checkpoint if self.checkpointed_layers else 0

    @property
    def recompute(self) -> int:
        """A checkpointed layer recomputes its whole saved set during backward."""
        return self.layer_saved if self.checkpointed_layers else 0


def residual_bytes(s: Scenario) -> int:
    """dtype of the residual stream: fp32 when the embedding weight is fp32 (an fp32 run, an fp32
    trainable embedding under autocast, or PEFT's kbit upcast), else the compute dtype."""
    if s.precision == "fp32":
        return 4
    if s.tuning == "qlora" and s.kbit_upcast:
        return 4
    fp32_master_in_module = s.precision.endswith("mixed") and not engine_of(s).casts_module(s)
    if s.model.embedding_norm and _fp32_layer_norm(s):  # BLOOM: an fp32 embedding LayerNorm starts the stream
        return 4
    fp32_embedding = fp32_master_in_module and s.trains_whole("embed_tokens") or s.frozen_fp32_in_module
    return 4 if fp32_embedding else s.compute_bytes


def _fp32_layer_norm(s: Scenario) -> bool:
    """F.layer_norm is on CUDA autocast's fp32 list: it saves an fp32 copy of its input and outputs fp32."""
    return s.model.norm == "layer" and s.runs_autocast


def norm_output_bytes(s: Scenario, rb: int) -> int:
    return 4 if _fp32_layer_norm(s) else rb


def _has_mask(s: Scenario) -> bool:
    """A padded batch carries padding positions, so transformers builds an attention mask (a framework's own
    collate may pad without one: its profile's [model_code] padding_mask)."""
    return s.padding == "padded" and model_code(s.profile).get("padding_mask", True)


def attention_per_token(s: Scenario, b: int) -> tuple[int, int, int]:
    """(saved bytes per token, saved bytes per token per key position, transient per token per key)."""
    saved, per_key_saved, per_key_transient = _kernel_per_token(s, b)
    return saved + fused_qkv_rest(s, b, _has_mask(s)), per_key_saved, per_key_transient


def _kernel_per_token(s: Scenario, b: int) -> tuple[int, int, int]:
    """What the attention kernel saves (attention_per_token's three); its output, in the [B,T,H,d] layout, is also
    o_proj's input."""
    m = s.model
    q = m.num_heads * m.head_dim
    kv = m.num_kv_heads * m.head_dim
    lse = 4 * m.num_heads
    repeated = q if m.num_kv_heads != m.num_heads else kv
    if s.attention == "flash":  # q, k, v (native GQA), out, fp32 logsumexp; unpadding adds a copy and an index
        return b * (q + 2 * kv + q) + lse + (b * m.hidden_size + 8 if _has_mask(s) else 0), 0, 0
    if s.attention == "sdpa" and m.sdpa_math:  # torch's math kernel: fp32 q, k, v copies, the fp32 softmax saved
        return 4 * (q + 2 * kv) + (b * q), 4 * m.num_heads, 8 * m.num_heads
    if s.attention == "sdpa" and not _has_mask(s):  # no mask, enable_gqa: the flash kernel
        # a framework that expands k, v to every query head itself hands the kernel q-sized copies (model_code)
        return b * (q + 2 * (q if model_code(s.profile).get("expands_kv") else kv) + q) + lse, 0, 0
    if s.attention == "sdpa":  # bool mask -> mem-efficient kernel over repeat_kv'd k, v
        # one kv head: repeat_kv's expand + reshape of a size-1 head dim is a view, the kernel saves no copy (traced)
        return b * (q + 2 * (kv if m.num_kv_heads == 1 else repeated) + q) + lse, 0, 0
    return eager_kernel(s, b)


def _adapted(s: Scenario, adapters: list[ParamTensor]) -> dict[str, tuple[int, float]]:
    """module name -> (rank, adapters per layer; experts count by the share of tokens routed to them)."""
    layers = max(s.model.num_layers, 1)
    out: dict[str, tuple[int, float]] = {}
    for t in adapters:
        if t.name.endswith(("lora_A", ".adapter")) and t.per_layer:
            share = s.model.experts_per_token / s.model.num_experts if ".experts." in t.name else 1.0
            rank = t.out_features if t.name.endswith("lora_A") else s.lora_rank
            out[t.module] = (rank, out.get(t.module, (rank, 0.0))[1] + share * t.count / layers)
    return out


def _peft_facts(s: Scenario, module: str, sizes: dict[str, int]) -> dict:
    setup = setup_name(s.precision, s.runs_autocast, s.adapter_bytes)
    return facts_for(s.tuning, setup, feedforward(s.model, s.tuning, module), sizes)


def _peft_widths(s: Scenario, adapters: list[ParamTensor]) -> dict[str, dict[str, int]]:
    return {t.module: layer_sizes(s.tuning, t.in_features, t.out_features, s.lora_rank)
            for t in adapters if t.name.endswith(".adapter")}


def _peft_per_token(s: Scenario, module: str, sizes: dict[str, int], width: int) -> tuple[int, bool]:
    """A PEFT method's saved bytes per token of one adapted Linear (data/peft.toml), and whether one of its
    saved tensors is the Linear's input itself; plus a bool dropout mask when the method drops its input."""
    facts = _peft_facts(s, module, sizes)
    mask = width if s.lora_dropout > 0 else 0
    return bytes_of(facts["saved"], sizes, per_token=True) + mask, facts["saves_input"]


def _mlp_grad_bytes(s: Scenario, adapters: list[ParamTensor], b: int) -> int:
    """Bytes per element of the MLP's intermediate-wide backward temporaries. An activation whose output autocast
    leaves fp32, read by an adapted down projection, is cast once per reader (the base Linear and the adapter): both
    input gradients come back through the casts in fp32 and are summed in fp32 (traced: GPT-J, LoRA on fc_out)."""
    m = s.model
    down = {mod for mod, roles in m.linear_names.items() if set(roles) & {"down", "proj"}}
    read_twice = bool(down & set(_adapted(s, adapters)))
    return 4 if read_twice and activation_fp32_output(m.hidden_act, s.runs_autocast) else b


def _peft_fixed(s: Scenario, adapters: list[ParamTensor]) -> int:
    """Bytes per decoder layer a PEFT method saves whatever the tokens: weight-sized deltas (LoHa), the
    autocast copies of its adapter weights."""
    if wraps(s.tuning) != "linear":
        return 0
    widths = _peft_widths(s, adapters)
    return int(sum(count * bytes_of(_peft_facts(s, mod, widths[mod])["saved"], widths[mod], per_token=False)
                   for mod, (_, count) in _adapted(s, adapters).items()))


def _peft_backward(s: Scenario, adapters: list[ParamTensor]) -> int:
    """Weight-sized temporaries while the widest adapted Linear runs its backward (LoHa rebuilds its delta's
    factors there; data/peft.toml backward_weights)."""
    if wraps(s.tuning) != "linear":
        return 0
    widths = _peft_widths(s, adapters)
    return int(max((_peft_facts(s, mod, w)["backward_weights"] * w["I"] * w["O"] * s.adapter_bytes
                    + bytes_of(_peft_facts(s, mod, w).get("backward", []), w, per_token=False)  # BOFT: I x I
                    for mod, w in widths.items()), default=0))


def _group_inputs(s: Scenario, b: int, rb: int, adapters: list[ParamTensor]) -> tuple[int, int]:
    """Bytes per token that the Linears of one layer save of their inputs (PEFT lora/layer.py Linear.forward:
    lora_A saves what it reads, B saves A's rank-wide output). Returns (the attention's input group, the others:
    the MLP's input, o's and down's; released before the attention's backward, eager_attention.py).

    A trainable Linear saves its input once per group of modules reading it; under autocast an fp32 input is
    cast per module. A LoRA adapter whose dtype differs from its input casts it (PEFT), and autocast casts
    it back: each such adapter saves a private copy. A frozen, unadapted Linear saves nothing."""
    m = s.model
    # PEFT adapts transformers 5's stacked experts through their parameters (a weight-sized delta, counted in
    # _expert_lora_deltas), not as Linears reading the routed tokens: no per-token input of theirs is saved (traced)
    adapted = _adapted(s, [t for t in adapters if ".experts." not in t.name])
    peft = _peft_widths(s, adapters)
    ab = s.adapter_bytes
    trainable_base = s.tuning in ("full", "freeze")
    # old bitsandbytes MatMul4Bit, and MatMul8bitLt, keep the input A on ctx for every quantized Linear (int8_base.py)
    saves_input = trainable_base or (s.tuning == "qlora" and (s.bnb_saves_input or s.quant_bits == 8))
    autocast = s.runs_autocast
    nb = norm_output_bytes(s, rb)
    db = 4 if activation_fp32_output(m.hidden_act, autocast) else b
    groups = {"attn_in": ({"q", "k", "v"}, m.hidden_size, nb), "o": ({"o"}, m.num_heads * m.head_dim, b),
              "mlp_in": ({"gate", "up", "fc"}, m.hidden_size, nb), "down": ({"down", "proj"}, m.intermediate_size, db)}
    totals = {}
    for name, (roles, width, xb) in groups.items():
        modules = [mod for mod, r in m.linear_names.items() if set(r) & roles]
        cost = 0.0
        shared = False
        if saves_input:
            if autocast and xb == 4:
                cost += 2 * width * len(modules)  # each Linear's bf16 autocast copy
            else:
                shared = True
        for mod in modules:
            if mod not in adapted:
                continue
            rank, count = adapted[mod]
            if mod in peft:
                saved, reads_input = _peft_per_token(s, mod, peft[mod], width)
                cost += count * saved
                shared = shared or reads_input
                continue
            cost += count * rank * (b if autocast else ab)
            if s.lora_dropout > 0:
                cost += count * width  # bool mask
            # an input in another dtype than the adapter is cast (PEFT), and an fp32 one is cast to bf16 by autocast
            if (ab != xb or (autocast and xb == 4)) and not (s.tuning == "qlora" and autocast):
                cost += count * width * (2 if autocast else ab)  # private cast copy
            else:
                shared = True
        routed = name == "down" and s.model.is_moe  # MoE down inputs are the routed copies, counted there
        if shared and not (name == "o" and s.attention != "eager") and not routed:
            cost += width * xb  # saved once (o's input is the kernel output, already saved)
        totals[name] = cost
    return int(totals["attn_in"]), int(totals["mlp_in"] + totals["o"] + totals["down"])


def _norm_per_token(s: Scenario, b: int, rb: int) -> int:
    """HF RMSNorm saves an fp32 copy of its input (the input itself when already fp32) and, when its weight
    trains, the normalized tensor in the input dtype; LayerNorm saves its input and two fp32 stats."""
    m = s.model
    h = m.hidden_size
    trains = s.tuning in ("full", "freeze", "ln_tuning") or prompt_adapter(s).get("trains_norms", False)
    if m.norm == "rms":
        fp32_scale = m.norm_fp32_scale or model_code(s.profile).get("norm_fp32_scale", False)
        return 4 * h + ((4 if fp32_scale else rb) * h if trains else 0)
    if m.norm == "none" or _fp32_layer_norm(s):  # OLMo's parameter-free LayerNorm, or autocast: an fp32 copy
        return 4 * h + 8
    return rb * h + 8


MOE_INDEX_BYTES_PER_PAIR = 36  # per (token, expert): int64 top-k index, sort and inverse permutations, weight


def _moe_per_token(s: Scenario, b: int, experts_adapted: bool = False) -> int:
    """One MoE block, per token (transformers 5.x grouped experts, traced): each of the k routed copies keeps
    its gathered input, gate_up output, act(gate), down input and the down output kept by the routing-weight
    multiply; the router keeps an fp32 softmax; a shared expert saves like a dense gated MLP."""
    m = s.model
    h, f, k = m.hidden_size, m.moe_intermediate_size or m.intermediate_size, m.experts_per_token
    trains = s.tuning in ("full", "freeze")
    # adapted experts need their inputs for the delta's gradient, as trained ones do (traced)
    pair = b * (2 * h + 4 * f) if trains or experts_adapted else b * (h + 3 * f)
    fs = m.shared_expert_intermediate_size or m.extra.get("n_shared_experts", 0) * f
    gate = b * h + b if m.extra.get("shared_expert_gate") or m.arch == "qwen2_moe" else 0
    return k * (pair + MOE_INDEX_BYTES_PER_PAIR) + 4 * m.num_experts + (4 if trains else 3) * fs * b + gate


def _expert_lora_deltas(s: Scenario, b: int, adapters: list[ParamTensor]) -> int:
    """PEFT adapts transformers 5's stacked expert weights through target_parameters: it builds the whole
    delta B @ A per expert weight and keeps it for backward, a weight-sized tensor per layer (traced)."""
    if not s.model.is_moe:
        return 0
    adapted = {t.module for t in adapters if ".experts." in t.name}
    from memfit.memory.inventory import base_tensors

    per_layer = sum(t.numel * t.count for t in base_tensors(s.model)
                    if ".experts." in t.name and t.module in adapted and t.kind == "linear")
    return per_layer * b // max(s.model.num_layers, 1)


def _layer_per_token(s: Scenario, b: int, rb: int, adapters) -> tuple[int, int]:
    """Saved bytes per token of one layer: (its attention side: input norm, q/k/v inputs, what the kernel keeps;
    the rest, which the MLP's backward releases before the attention's runs: the other norms, o's and the MLP's
    inputs and intermediates, the residual dropout masks)."""
    m = s.model
    h, ffn = m.hidden_size, m.intermediate_size
    norm = _norm_per_token(s, b, rb) + (4 if m.norm == "rms" else 0)
    attn, _, _ = attention_per_token(s, b)
    attn_in, others = _group_inputs(s, b, rb, adapters)
    # MLP intermediates other than down's input: what the activation saves (activations.toml; F.silu and
    # F.gelu keep their input, gelu_new's formula keeps 4), plus, gated, the activation output and up output
    # the product keeps; down's input is counted with the Linear inputs
    autocast = s.runs_autocast
    act = activation_saved(m.hidden_act, autocast)
    if m.mlp == "plain" and activation_saves_output(m.hidden_act, autocast) and s.tuning in ("full", "freeze"):
        act -= 1  # the output it keeps is the trainable down Linear's saved input, counted with the Linear inputs
    product = (2 if activation_fp32_output(m.hidden_act, autocast) else 1) + 1  # act(gate) and up, kept by the product
    experts_adapted = any(".experts." in t.name for t in adapters)
    mlp = _moe_per_token(s, b, experts_adapted) if m.is_moe else int(b * ffn * (act + product if m.mlp == "gated" else act))
    mlp += 2 * h if m.dropout > 0 else 0  # residual dropouts after attention and MLP: bool masks
    if m.qk_norm != "none":
        # q/k norms: the fp32 input copy, and, only when their weight trains, the normalized tensor the weight's
        # gradient reads (fp32 when it scales in fp32); a frozen weight's multiply saves only the weight (traced)
        scaled = (4 if m.norm_fp32_scale else b) if s.tuning in ("full", "freeze", "ln_tuning") else 0
        attn += (4 + scaled) * (m.num_heads + m.num_kv_heads) * m.head_dim
    own = fused_qkv(s, b, _adapted(s, adapters)) + prompt_layer_extra(s, b, attn, norm)  # LitGPT's own model code
    own += outlier_bytes(s)  # an 8-bit base's outlier columns
    return norm + attn + attn_in + own, norm * max(m.norms_per_layer - 1, 0) + others + mlp


def activations(s: Scenario, adapters: list[ParamTensor]) -> Activations:
    if s.virtual_tokens_in_use:  # prompt / p-tuning: every layer and the head run the virtual tokens too
        s = s.with_changes(seq_len=s.seq_len + s.virtual_tokens_in_use)
    m = s.model
    b = s.compute_bytes
    rb = residual_bytes(s)
    n = s.tokens_per_micro_batch
    rows, t = s.micro_batch, s.seq_len
    _, per_key_saved, per_key_transient = attention_per_token(s, b)
    attention_side, mlp_side = _layer_per_token(s, b, rb, adapters)
    layer_saved = n * (attention_side + mlp_side) + rows * t * t * per_key_saved
    layer_saved += _expert_lora_deltas(s, b, adapters) + _peft_fixed(s, adapters)
    masks = 0
    if s.attention == "eager":
        masks = rows * t * t * b  # 4D float mask (masking_utils eager_mask)
    elif s.attention == "sdpa" and _has_mask(s):
        masks = rows * t * t  # 4D bool mask
        layer_saved += rows * t * t * b * (not m.sdpa_math)  # the mem-efficient kernel's bias (compute dtype)
    ckpt_layers, plain_layers = _checkpoint_split(s)
    offloaded = Recompute.of(s.checkpointing).on_host
    checkpoint = n * rb * m.hidden_size
    smart = unsloth_offload(s, checkpoint, ckpt_layers)  # unsloth's own: keeps some inputs on the GPU
    offloaded = offloaded and (smart is None or smart.host > 0)
    v = m.vocab_size
    logits_fwd, logits_saved, logits_bwd = _logits(s, n, v, b)
    own = code_logits(s, n, v)  # a framework's own loop and loss (LitGPT; traced, memory/own_code.py)
    if own:
        logits_fwd, logits_saved, logits_bwd = own.forward_peak, own.saved, own.backward_peak
    scaled = scaled_head(s, n, v)  # LitGPT's LLaMA-Adapter v2 head
    h = m.hidden_size
    rows_saved, head_copy, head_grad, embedding = _token_rows(s, n * b * m.hidden_size)
    return remote_code_adjusted(s, Activations(  # a remote-code family's own code (memory/remote_code.py)
        layer_saved=layer_saved,
        layer_checkpoint=0 if offloaded else checkpoint,
        checkpointed_layers=ckpt_layers,
        plain_layers=plain_layers,
        outside_layers=n * (_norm_per_token(s, b, rb) + (b * h if s.trains_whole("lm_head") else 0)  # final norm, head input
                            + (h if m.dropout > 0 else 0)) + rows_saved  # embedding dropout mask
        + (smart.device if smart else 0),
        shared_masks=masks,
        layer_forward_transient=n * b * max(4 * h, 2 * m.intermediate_size) + rows * t * t * per_key_transient,
        layer_backward_transient=layer_backward_transient(
            s, n, b, rb, n * (3 * m.intermediate_size * _mlp_grad_bytes(s, adapters, b) + 2 * h * b), mlp_side,
            rows * t * t, per_key_saved)
        + _peft_backward(s, adapters),
        logits_forward_peak=logits_fwd + head_copy + scaled,
        logits_saved=logits_saved + head_copy + scaled,
        logits_backward_peak=logits_bwd + head_copy + scaled,
        logits_grad=(n * v * (4 if s.precision == "fp32" else b) if s.loss in ("standard", "inplace_ce")
                     else _chunked_head(s, n, v, b))
        + head_copy + head_grad if not own else own.grad,
        logits_kept=own.kept if own else 0,
        host_offloaded=(smart.host if smart else checkpoint * ckpt_layers) if offloaded else 0,
        embedding_transient=embedding,
    ), (per_key_saved, per_key_transient, attention_backward_per_key(s, b, per_key_saved)))  # the count's per key


def _token_rows(s: Scenario, output: int) -> tuple[int, int, int, int]:
    """PEFT trainable tokens (data/peft.toml [trainable_tokens]): (what the embedding's forward saves, the merged
    V x H weight a tied head's layer builds in its forward and keeps until its backward, the V x H weight
    gradient that backward makes before selecting the trained rows, the embedding's own merged weight or weight
    gradient beside its `output` or that output's gradient). The head's two live with the logits; the
    embedding's comes when nothing else is saved yet (forward) or left (backward)."""
    if not (s.uses_adapters and s.trainable_tokens):
        return 0, 0, 0, 0
    f = facts_for("trainable_tokens", setup_name(s.precision, s.runs_autocast, s.adapter_bytes))
    sizes = {"V": s.model.vocab_size, "H": s.model.hidden_size, "N": s.trainable_tokens}
    tied = s.model.tie_embeddings

    def of(key: str) -> int:
        return int(bytes_of(f[key], sizes, per_token=False))
    embedding = output + max(of("embedding_forward"), of("embedding_backward"))
    return of("embedding_saved"), of("head_saved") if tied else 0, of("head_backward") if tied else 0, embedding


def _chunked_head(s: Scenario, n: int, v: int, b: int) -> int:
    """A framework's chunked loss whose head gradient is summed over its chunks (model_code chunked_loss_head,
    traced): the chunks' logit gradients still waiting and the extra head-sized gradients beside the one
    phases.py counts, alive while the head's chunk gradients are added up."""
    head = model_code(s.profile).get("chunked_loss_head")
    if s.loss != "chunked_output" or not head or b != 2:
        return 0
    per_element, head_copies = head
    extra = (head_copies - 1) * v * s.model.hidden_size * b if s.trains_whole("lm_head") else 0
    return int(n * v * per_element) + extra


def _checkpoint_split(s: Scenario) -> tuple[int, int]:
    # freeze tuning, LLaMA-Adapter: no gradient reaches the frozen layers below the trainable ones: they save nothing
    layers = s.freeze_trainable_layers if s.tuning == "freeze" else prompt_layers(s) or s.model.num_layers
    if s.checkpointing == "off":
        return 0, layers
    if s.checkpointing == "every_n":
        ck = -(-layers // s.checkpoint_every_n)
        return ck, layers - ck
    return layers, 0


def _logits(s: Scenario, n: int, v: int, b: int) -> tuple[int, int, int]:
    """(forward peak, saved after forward, backward peak) of lm_head output + loss."""
    h = s.model.hidden_size
    lb = 4 if (s.precision == "fp32" or s.tuning == "qlora" and s.kbit_upcast) else b
    up = 0 if lb == 4 else 4  # ForCausalLMLoss upcasts logits to fp32 unless they already are
    if s.loss == "liger":
        chunk = min(n, LIGER_CHUNK_ROUND * -(-n // max(1, -(-v // h))))
        grads = n * h * b + (v * h * 4 if s.trains_whole("lm_head") else 0)
        return chunk * v * (lb + 4) + grads, grads, grads
    if s.loss == "unsloth_ce":  # unsloth_zoo's fused linear cross entropy, from its source (memory/unsloth_loss.py)
        head = (2 if s.precision.endswith("pure") else 4) if s.trains_whole("lm_head") else 0
        return unsloth_loss_terms(s, n, v, b, head)
    if s.loss == "chunked_nll":
        c = min(n, TRL_CHUNK_TOKENS)
        return c * v * (lb + up + 4), 0, c * v * (lb + up + 8)
    # traced on the framework's own model code and loss (its profile's [model_code])
    measured = model_code(s.profile).get({"chunked_output": "chunked_loss", "standard": "standard_loss"}.get(s.loss))
    if measured and lb == 2:
        return cast(Triple, tuple(int(n * v * x) for x in measured))
    if s.loss == "chunked_output":
        c = -(-n // TORCHTUNE_CHUNKS)
        return n * v * (lb + 4) + c * v * up, n * v * 4, n * v * 4 + c * v * (8 + lb)
    cap = n * v * lb if s.model.logit_softcap else 0
    if s.loss == "inplace_ce" or transformers_release(s):  # measured per release and family (facts/loss_tail.py)
        return cast(Triple, tuple(int(n * v * x) + cap for x in loss_tail(s, lb)))
    # standard, on the pinned transformers (tests/trace/test_loss_tail.py checks it against the measured row):
    # bf16 logits + fp32 copy + fp32 log_softmax output; backward: saved log_softmax, the dense nll grad and the
    # log_softmax grad alive together. Soft-capped logits (Gemma 2) keep the tanh output for backward.
    return n * v * (lb + up + 4) + cap, n * v * 4 + cap, n * v * 12 + cap
