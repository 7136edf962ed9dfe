"""HF Trainer's FSDP path run for real on 2 gloo ranks (CPU): accelerate's own preparation, memory by category per rank.

    python -m memfit.measure.accelerate_ranks < RUNS.jsonl      # one JSON run per line; prints one result per line

A run with "world": 1 does the same step on one process without FSDP (bench/accelerate_fsdp.py compares the two).

Each rank does what transformers' Trainer does with `fsdp=True` (5.24, `_inner_training_loop`) on a small Llama built
from a config:
  - the plugin arguments `TrainingArguments(fsdp_config={"version": V, "transformer_layer_cls_to_wrap": [...]})`
    computes itself (`fsdp_plugin_args`: FSDP1 FULL_SHARD, use_orig_params, NO_PREFETCH; FSDP2 reshard_after_forward),
    handed to accelerate's FullyShardedDataParallelPlugin;
  - PEFT LoRA: transformers' `update_fsdp_plugin_peft` (PEFT's fsdp_auto_wrap_policy: each trainable Linear its own
    unit under FSDP1);
  - FSDP1: `accelerator.prepare(model)`, then the optimizer over the wrapped model's parameters and its prepare;
    FSDP2: `accelerator.prepare(model, optimizer)` together (accelerate refuses FSDP2 otherwise);
  - steps of forward with labels (the model's own loss), `accelerator.backward`, `optimizer.step()`, `zero_grad`.
Run by a transformers 4.x (tests/trace/setup_fms_venv.sh: fms-acceleration's benchmark releases, transformers 4.48.1,
accelerate 1.0.1, peft 0.13.2), each rank does what that Trainer does instead (`_inner_training_loop`, 4.48.1), as
`accelerate launch --config_file` starts it with fms-acceleration's scripts/benchmarks/accelerate.yaml:
  - the plugin from the environment that launch writes from that file (FSDP_* below; use_orig_params is launch's
    default, true), and the Trainer's `_fsdp_qlora_plugin_updates` (PEFT's fsdp_auto_wrap_policy for LoRA);
  - `gradient_checkpointing_enable()` with no kwargs (4.x: use_reentrant=True; a run's "reentrant" passes
    gradient_checkpointing_kwargs) and, for LoRA, the `enable_input_require_grads()` TRL 0.13's SFTTrainer adds
    for reentrant checkpointing (sft_trainer.py);
  - `accelerator.prepare(model)`, the optimizer over the wrapped model's parameters, `accelerator.prepare(model,
    optimizer)`; then the same steps.
On a CPU accelerate picks MULTI_CPU (DDP) before it looks at FSDP, so the state is set to FSDP by hand, FSDP1 gets
the CPU as its device (it refuses device_id=None without an accelerator) and no sync_module_states nor
cpu_ram_efficient_loading (they need one; they only decide how rank 0's weights reach the others at wrap time);
nothing else changes. Every storage is counted by memfit.measure.tracker; on a CPU every tensor is "device".
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable

from memfit.measure.ranks import claim_states, patch_fsdp1, replaced, runner_main

ROOTS = ("/torch/distributed/", "/torch/optim/", "/torch/utils/checkpoint", "/accelerate/", "/peft/", "/transformers/")


def _model(run: dict):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d = run["dims"]
    # attn_implementation reaches PreTrainedConfig through the **kwargs transformers' @strict dataclass hides from
    # its typed signature; `to` is transformers' @wraps(Module.to) override, which typeshed's _Wrapped leaves unbound
    config = LlamaConfig(hidden_size=d["hidden"], num_hidden_layers=d["layers"], num_attention_heads=d["heads"],
                         num_key_value_heads=d["kv_heads"], intermediate_size=d["inter"], vocab_size=d["vocab"],
                         tie_word_embeddings=run.get("tied", False),
                         attn_implementation="sdpa")  # type: ignore[call-arg]
    model = LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[arg-type]
    if run["tuning"] == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear", lora_dropout=0.0))
    if run["checkpointing"]:
        # the Trainer's call: transformers' own default kwargs, or TrainingArguments' gradient_checkpointing_kwargs
        said = {"use_reentrant": run["reentrant"]} if "reentrant" in run else None
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=said)
        if run["tuning"] == "lora" and _trainer_4() and run.get("reentrant", True):
            model.enable_input_require_grads()  # reentrant: the frozen embedding's output must require grad
    return model


def _trainer_4() -> bool:
    """Run by a transformers 4.x: its Trainer's FSDP path (the module docstring), not 5.x's."""
    import transformers

    return int(transformers.__version__.split(".")[0]) < 5


# What `accelerate launch --config_file` writes for fms-acceleration's scripts/benchmarks/accelerate.yaml (24bdadb:
# FULL_SHARD, TRANSFORMER_BASED_WRAP, BACKWARD_PRE, no forward prefetch, no offload, SHARDED_STATE_DICT), with
# launch's default use_orig_params (accelerate 1.0.1 commands/launch.py `--fsdp_use_orig_params` default "true")
FMS_LAUNCH_ENV = {"FSDP_SHARDING_STRATEGY": "1", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
                  "FSDP_BACKWARD_PREFETCH": "BACKWARD_PRE", "FSDP_FORWARD_PREFETCH": "false",
                  "FSDP_OFFLOAD_PARAMS": "false", "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
                  "FSDP_USE_ORIG_PARAMS": "true", "FSDP_SYNC_MODULE_STATES": "false",
                  "FSDP_CPU_RAM_EFFICIENT_LOADING": "false"}


def _on_cpu(prepare):
    """FSDP1 wrapping on the CPU (it refuses device_id=None without an accelerator), only while `prepare` runs."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel

    original: Callable[..., None] = FullyShardedDataParallel.__init__  # called with what the caller passed

    def on_cpu(fsdp, *a, device_id=None, **k):
        original(fsdp, *a, device_id=torch.device("cpu"), **k)

    with replaced(FullyShardedDataParallel, "__init__", on_cpu):
        return prepare()


def _prepared_trainer_4(run: dict, model):
    """The model and optimizer as transformers 4.48.1's Trainer leaves them under fms-acceleration's launch."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    os.environ.update(FMS_LAUNCH_ENV)
    accelerator = Accelerator(cpu=True)
    accelerator.state.distributed_type = DistributedType.FSDP
    plugin = FullyShardedDataParallelPlugin()
    accelerator.state.fsdp_plugin = plugin
    if run["tuning"] == "lora":  # Trainer._fsdp_qlora_plugin_updates
        from peft.utils.other import fsdp_auto_wrap_policy

        plugin.auto_wrap_policy = fsdp_auto_wrap_policy(model)

    def prepare():
        wrapped = accelerator.prepare(model)
        optimizer = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], fused=True)
        return (*accelerator.prepare(wrapped, optimizer), accelerator)
    return _on_cpu(prepare)


def _prepared(run: dict, model):
    """The model and optimizer as the Trainer's accelerator leaves them."""
    if _trainer_4():
        return _prepared_trainer_4(run, model)
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from transformers import TrainingArguments
    from transformers.distributed.fsdp import update_fsdp_plugin_peft

    version = run["fsdp_version"]
    # fsdp=True as the Trainer's own help says it (`fsdp` is annotated str | None, and set to True in __post_init__)
    args = TrainingArguments(output_dir="/tmp/memfit-accelerate-ranks", use_cpu=True,
                             fsdp=True,  # type: ignore[arg-type]
                             report_to=[],
                             fsdp_config={"version": version, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                                          **run.get("fsdp_config", {})})
    accelerator = Accelerator(cpu=True)
    accelerator.state.distributed_type = DistributedType.FSDP
    # sync_module_states broadcasts rank 0's weights at wrap time from a device module; a CPU has none (and every
    # rank builds the same seeded model here)
    plugin_args = {**args.fsdp_plugin_args, **({"sync_module_states": False} if version == 1 else {})}
    accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin(**plugin_args)

    def prepare():
        if version == 2:
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], fused=True)
            return (*accelerator.prepare(model, optimizer), accelerator)
        if run["tuning"] == "lora":
            update_fsdp_plugin_peft(model, accelerator)
        wrapped = accelerator.prepare(model)
        optimizer = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], fused=True)
        return wrapped, accelerator.prepare(optimizer), accelerator
    return _on_cpu(prepare)


def run_rank(run: dict) -> dict:
    import torch

    from memfit.measure.patches import install_patches
    from memfit.measure.tracker import MemoryTracker

    current: dict[str, MemoryTracker | None] = {"tk": None}
    install_patches(lambda: current["tk"])
    patch_fsdp1(lambda: current["tk"])
    tk = MemoryTracker(roots=ROOTS)
    tk.rules.insert(0, ("fsdp/_flat_param.py:init_flat_param_attributes", "weights", "device"))
    current["tk"] = tk
    rank = int(os.environ["RANK"])
    if run["world"] == 1:
        torch.distributed.init_process_group("gloo")  # as on several ranks, so the processes differ in nothing else
    with tk:
        tk.set_phase("load", 0)
        if run["world"] > 1:
            model, optimizer, accelerator = _prepared(run, _model(run))
        else:  # the same step on one device: what the FSDP run is compared against
            model, accelerator = _model(run), None
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], fused=True)
        inner = getattr(optimizer, "optimizer", optimizer)
        gen = torch.Generator().manual_seed(rank)
        for step in range(1, run["steps"] + 1):
            claim_states(tk, model, inner)
            tk.set_phase("forward", step)
            ids = torch.randint(0, run["dims"]["vocab"], (run["micro_batch"], run["seq_len"]), generator=gen)
            loss = model(input_ids=ids, labels=ids).loss
            tk.set_phase("backward", step)
            accelerator.backward(loss) if accelerator else loss.backward()
            claim_states(tk, model, inner)
            tk.set_phase("optimizer_step", step)
            optimizer.step()
            optimizer.zero_grad()
            del loss, ids
        tk.set_phase("done", run["steps"] + 1)
    current["tk"] = None
    phases = {}
    for phase in ("forward", "backward", "optimizer_step"):
        snaps = [snap for (step, ph, side), snap in tk.peaks.items()
                 if str(step) == str(run["steps"]) and side == "device" and ph == phase]
        if snaps:
            phases[phase] = dict(max(snaps, key=lambda x: x.total).parts)
    from importlib.metadata import version

    return {"rank": rank, "phases": phases, "peak": max(sum(p.values()) for p in phases.values()),
            "versions": {name: version(name) for name in ("torch", "transformers", "accelerate", "peft")}}


def main(argv: list[str]) -> int:
    return runner_main(argv, "memfit.measure.accelerate_ranks", run_rank, world_of=lambda run: run["world"])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
