"""Trace GLM-4 (hub remote code modeling_chatglm.py, ChatGLMForConditionalGeneration) on its OWN modeling code.

The main trace builds remote-code families as a transformers-native twin (build.py SUBSTITUTES: chatglm -> glm),
which has GLM-4's tensor shapes but not its code. This module loads the real modeling_chatglm.py from a directory
outside the repository (memfit ships only the facts derived from it: data/remote_code.toml [chatglm], with the
source's repository, commit and hash) and runs OpenRLHF's DPO step (memfit/trace/dpo.py) on it under the
Accountant, policy and separate reference both built from the file.

    MEMFIT_GLM4_SOURCE=/tmp/glm4  # holds modeling_chatglm.py and configuration_chatglm.py

The file does not build under transformers 5 (its config lacks the generation keys transformers 5 reads): run it
with an older transformers first on the path (PYTHONPATH=/tmp/tf/4.44.2:.).

What the file does that the twin does not, and so why this module exists:
- `gradient_checkpointing_enable` is overridden and only checks support: the call every transformers-run framework
  makes (OpenRLHF's Actor, HF Trainer) leaves GLMTransformer.gradient_checkpointing False, so the layers are not
  checkpointed. `honor_checkpointing=True` sets the flag itself (what LLaMA-Factory's replacement
  gradient_checkpointing_enable reaches, via _set_gradient_checkpointing); the file then calls
  torch.utils.checkpoint with use_reentrant=False.
- attention comes from config._attn_implementation: "eager" is CoreAttention (baddbmm, an fp32 copy of the scores
  scaled by the layer number, masked_fill, fp32 softmax, a 16-bit copy for PV; what OpenRLHF <= 0.8 loads without
  --flash_attn), "sdpa" its SdpaAttention; K and V are repeated to every head (expand + contiguous) before either.
- the mask: `not attention_mask.all()` picks the file's get_masks (a bool rows x 1 x T x T shared by the layers,
  built through two fp32 rows x T x T); an all-ones mask leaves each eager layer to build its own causal mask.
"""
from __future__ import annotations

import sys
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch

from memfit.facts.scenario import Scenario
from memfit.trace.build import BuiltModel, set_dtypes
from memfit.trace.cuda import CudaTarget
from memfit.trace.remote_file import RemoteFile

# the modeling file imports its configuration relatively: they load as one package
SOURCE = RemoteFile("MEMFIT_GLM4_SOURCE", "/tmp/glm4", "memfit_glm4_remote",
                    ("modeling_chatglm.py", "configuration_chatglm.py"))
# huggingface.co/THUDM/glm-4-9b-chat config.json, the keys the catalog's ModelSpec does not carry
HUB_CONFIG = dict(seq_length=131072, rope_ratio=500, original_rope=True, rmsnorm=True, post_layer_norm=True,
                  apply_query_key_layer_scaling=True, attention_softmax_in_fp32=True, add_qkv_bias=True,
                  add_bias_linear=False, multi_query_attention=True, layernorm_epsilon=1.5625e-07,
                  fp32_residual_connection=False, hidden_dropout=0.0, attention_dropout=0.0)


source_dir, available, file_sha256, load = SOURCE.source_dir, SOURCE.available, SOURCE.file_sha256, SOURCE.load


@dataclass
class GlmBuilt(BuiltModel):
    @property
    def lm_head(self) -> torch.nn.Module:  # the file defines no get_output_embeddings
        return self.hf_model.get_submodule("transformer.output_layer")


def _mask_hook(pad_tokens: int):
    """Answer the file's `attention_mask.all()` (data-dependent: fake tensors cannot) with what the batch is known
    to be, the way the file itself goes on: a padded batch gets the file's own get_masks as full_attention_mask, a
    batch without padding no mask at all (what the file does when every position is 1)."""
    def hook(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if mask is not None and kwargs.get("full_attention_mask") is None:
            if pad_tokens:
                kwargs["full_attention_mask"] = module.get_masks(kwargs["input_ids"], None, padding_mask=mask)
            else:
                kwargs["attention_mask"] = None
        return args, kwargs
    return hook


def build(s: Scenario, fake_mode=None, honor_checkpointing: bool = False, pad_tokens: int = 1) -> GlmBuilt:
    """ChatGLMForConditionalGeneration with the scenario's shapes, attention, dtypes and trainability; checkpointing
    as the framework's gradient_checkpointing_enable call leaves it (or set, with honor_checkpointing)."""
    mod = load()
    config_mod = sys.modules[f"{SOURCE.package}.configuration_chatglm"]
    if s.attention not in ("eager", "sdpa"):
        raise ValueError(f"GLM-4's own {s.attention} path is not traced (eager and sdpa are)")
    m = s.model
    config = config_mod.ChatGLMConfig(
        num_layers=m.num_layers, padded_vocab_size=m.vocab_size, hidden_size=m.hidden_size,
        ffn_hidden_size=m.intermediate_size, kv_channels=m.head_dim, num_attention_heads=m.num_heads,
        multi_query_group_num=m.num_kv_heads, torch_dtype=torch.bfloat16, use_cache=False, **HUB_CONFIG)
    config._attn_implementation = s.attention  # what from_pretrained(attn_implementation=...) sets
    with torch.device("meta") if fake_mode is not None else nullcontext(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = mod.ChatGLMForConditionalGeneration(config, empty_init=False)
    hf.train()
    for p in hf.parameters():
        p.requires_grad_(s.tuning == "full")
    set_dtypes(hf, s)
    if s.checkpointing != "off":
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # OpenRLHF's call
        if honor_checkpointing:
            hf.transformer.encoder.gradient_checkpointing = True
    if fake_mode is not None:
        with fake_mode:
            for module in hf.modules():
                module.to_empty(device="cpu", recurse=False)
    hf.transformer.register_forward_pre_hook(_mask_hook(pad_tokens), with_kwargs=True)
    return GlmBuilt(hf, hf, torch.bfloat16, None, "chatglm", s.attention, [])


def checkpointing_enable_sets_flag() -> bool:
    """Whether the file's gradient_checkpointing_enable turns checkpointing on (a one-layer model, real tensors)."""
    load()
    config = sys.modules[f"{SOURCE.package}.configuration_chatglm"].ChatGLMConfig(
        num_layers=1, padded_vocab_size=64, hidden_size=64, ffn_hidden_size=64, kv_channels=16,
        num_attention_heads=4, multi_query_group_num=2, **{**HUB_CONFIG, "seq_length": 64})
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = sys.modules[f"{SOURCE.package}.modeling_chatglm"].ChatGLMForConditionalGeneration(config, empty_init=False)
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return bool(hf.transformer.encoder.gradient_checkpointing)


def build_reference(s: Scenario, fake_mode, pad_tokens: int) -> GlmBuilt:
    """OpenRLHF's separate reference from the same file: whole, 16-bit, frozen, eval (memfit/trace/dpo.py)."""
    from memfit.trace.dpo import reference_scenario

    ref = build(reference_scenario(s), fake_mode, pad_tokens=pad_tokens)
    ref.model.eval()
    for p in ref.model.parameters():
        p.requires_grad_(False)
    return ref


@dataclass
class Glm4Trace:
    phases: dict  # phase -> Breakdown json of the last step's peaks
    marks: dict  # forward_end / backward_end / step_end -> Breakdown json
    kernels: dict
    checkpointed: bool  # whether the layers ran checkpointed
    live: dict = field(default_factory=dict)  # mark -> [(bytes, category, origin)] when traced with origins


def trace(s: Scenario, steps: int = 2, layers: int | None = None, pad_tokens: int = 1, origins: bool = False,
          honor_checkpointing: bool = False, reference: bool = True) -> Glm4Trace:
    """`steps` OpenRLHF DPO steps of `s` on GLM-4's own code (fake tensors); the last step's peaks. Without
    `reference` the step is the policy's alone (its log-probs against zero reference log-probs)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memfit.trace import run, training_step

    if layers is not None:
        s = replace(s, model=replace(s.model, num_layers=layers))
    acc, live = training_step.origins_accountant(origins, steps)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    built = build(s, fake_mode, honor_checkpointing, pad_tokens)
    ref = build_reference(s, fake_mode, pad_tokens) if reference else None
    optimizer = run.make_optimizer(s, built.trainable)
    target = CudaTarget.for_gpu(s.hardware.gpu)
    phases, marks, kernels = training_step.run_steps(
        acc, built, steps, lambda step: _step(acc, built, ref, optimizer, s, step, pad_tokens, target), fake_mode, ref)
    encoder = built.hf_model.get_submodule("transformer.encoder")
    return Glm4Trace(phases, marks, kernels, bool(encoder.gradient_checkpointing), live)


def _step(acc, built, ref, optimizer, s, step, pad_tokens, target) -> dict:
    """run._train_step's DPO step without transformers 5's mask helpers (the file does not use them): the policy's
    concatenated forward with fp32 log-probs, the reference's under no_grad, DPOLoss, backward, clip, AdamW."""
    from memfit.trace import dpo, run

    # policy alone: its log-probs live to the step's end (OpenRLHF's loop holds them in locals through backward and
    # the optimizer step), not just to the loss
    held = []

    def forward_loss(batch):
        if ref is not None:
            return dpo.forward_loss(acc, built, ref, batch, s)
        held.extend(dpo.concatenated_forward(built.model, batch))
        chosen, rejected, _ = held
        return dpo.dpo_loss(chosen, rejected, torch.zeros_like(chosen), torch.zeros_like(rejected), False)

    return run.hf_step(acc, built, optimizer, step, target, lambda: dpo.preference_batch(s, pad_tokens, True, acc),
                       forward_loss, ref)
