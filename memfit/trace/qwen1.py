"""Trace first-generation Qwen (hub remote code modeling_qwen.py, QWenLMHeadModel) on its OWN modeling code.

The main trace builds remote-code families as a transformers-native twin (build.py SUBSTITUTES: qwen -> qwen2),
which has Qwen-1's tensor shapes but not its code. This module loads the real modeling_qwen.py from a directory
outside the repository (memfit ships only the facts derived from it: data/remote_code.toml, with the source's
repository, commit and hash) and runs HF-Trainer-like steps of it under the Accountant, as run.py does.

    MEMFIT_QWEN1_SOURCE=/tmp/qwen1  # holds modeling_qwen.py, configuration_qwen.py, qwen_generation_utils.py

The file was written for transformers 4.32-4.37 (it calls PreTrainedModel.get_head_mask, which transformers 5 no
longer has): run it with an older transformers first on the path (PYTHONPATH=/tmp/tf/4.44.2:.).

What the step reproduces of QwenLM/Qwen finetune.py (its train()): the model loads in bf16 (no torch_dtype, so the
remote code's autoset_precision picks bf16 on an A100), use_cache off; LoRA through PEFT on the scenario's targets;
with gradient checkpointing finetune.py calls enable_input_require_grads() for LoRA, and HF Trainer's
gradient_checkpointing_enable reaches the old-format `_set_gradient_checkpointing(module, value)` of the file,
which only sets QWenModel.gradient_checkpointing: the file then calls torch.utils.checkpoint.checkpoint itself
without use_reentrant (torch's default: reentrant), whatever gradient_checkpointing_kwargs say. The non-flash path
(flash-attn not installed, or use_flash_attn false): on a CPU the file never takes its flash branch. Attention
"sdpa" is the file's torch-2 path; "eager" its `_attn` path (memfit's name for it: the file has no
attn_implementation).
"""
from __future__ import annotations

import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch

from memfit.facts.scenario import Scenario
from memfit.trace.build import BuiltModel, set_dtypes
from memfit.trace.cuda import CudaTarget
from memfit.trace.remote_file import RemoteFile

# the remote files import each other relatively: they load as one package
SOURCE = RemoteFile("MEMFIT_QWEN1_SOURCE", "/tmp/qwen1", "memfit_qwen1_remote",
                    ("modeling_qwen.py", "configuration_qwen.py", "qwen_generation_utils.py"))
source_dir, available, file_sha256, load = SOURCE.source_dir, SOURCE.available, SOURCE.file_sha256, SOURCE.load


def build(s: Scenario, fake_mode=None) -> BuiltModel:
    """QWenLMHeadModel with the scenario's shapes, trainability, dtypes and checkpointing, as finetune.py sets it up."""
    from memfit.trace.peft import apply_peft

    mod = load()
    # the file's own switch between its two non-flash paths: SDPA with a per-layer mask on torch 2, else `_attn`
    # (scores, softmax and PV in eager ops; what torch < 2 ran, and every torch before the 2023-10-14 revision)
    mod.SUPPORT_TORCH2 = s.attention != "eager"
    m = s.model
    config = mod.QWenConfig(vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
                            num_attention_heads=m.num_heads, kv_channels=m.head_dim,
                            intermediate_size=2 * m.intermediate_size,  # config.json holds both branches' sum
                            bf16=s.compute_bytes == 2, use_flash_attn=False, use_cache=False, seq_length=8192)
    with torch.device("meta") if fake_mode is not None else nullcontext(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = mod.QWenLMHeadModel(config)
    hf.train()
    model = hf
    if s.uses_adapters:
        model = apply_peft(hf, s, "qwen")
        model.train()
    else:
        for p in model.parameters():
            p.requires_grad_(s.tuning == "full")
    set_dtypes(model, s)
    if s.checkpointing != "off":
        hf.transformer.gradient_checkpointing = True  # what the old-format _set_gradient_checkpointing does
        if s.uses_adapters:
            hf.enable_input_require_grads()  # finetune.py, for LoRA under gradient checkpointing
    if fake_mode is not None:
        with fake_mode:
            for module in model.modules():
                module.to_empty(device="cpu", recurse=False)
    autocast = torch.bfloat16 if s.runs_autocast else None
    return BuiltModel(model, hf, torch.bfloat16, autocast, "qwen", "sdpa", [])


@dataclass
class Qwen1Trace:
    phases: dict  # phase -> Breakdown json of the last step's peaks
    marks: dict  # forward_end / backward_end / step_end -> Breakdown json
    kernels: dict
    live: dict = field(default_factory=dict)  # mark -> [(bytes, category, origin)] when traced with origins


def trace(s: Scenario, steps: int = 2, layers: int | None = None, pad_tokens: int = 1, origins: bool = False,
          fake: bool = True) -> Qwen1Trace:
    """`steps` training steps of `s` on Qwen-1's own code (fake tensors by default); the last step's peaks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memfit.trace import run, training_step

    if layers is not None:
        s = replace(s, model=replace(s.model, num_layers=layers))
    acc, live = training_step.origins_accountant(origins, steps)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
    built = build(s, fake_mode)
    optimizer = run.make_optimizer(s, built.trainable)
    target = CudaTarget.for_gpu(s.hardware.gpu)
    phases, marks, kernels = training_step.run_steps(
        acc, built, steps, lambda step: _step(acc, built, optimizer, s, step, pad_tokens, fake, target), fake_mode)
    return Qwen1Trace(phases, marks, kernels, live)


def _step(acc, built, optimizer, s, step, pad_tokens, fake, target) -> dict:
    """HF Trainer's training_step, as run.py runs it (without transformers 5's mask helpers, which the file does not
    use): forward with labels under bf16 autocast, keep the loss only, backward, clip, AdamW, zero_grad."""
    from memfit.trace import run

    def new_batch() -> run.Batch:
        batch = run.make_batch(s, pad_tokens, fake, acc)
        if "attention_mask" not in batch.kwargs and pad_tokens:  # finetune.py always passes input_ids.ne(pad)
            batch.kwargs["attention_mask"] = torch.ones_like(batch.kwargs["input_ids"])
        return batch

    return run.hf_step(acc, built, optimizer, step, target, new_batch, lambda batch: built.model(**batch.kwargs).loss)
