"""verl 0.9.1's own FSDP engine (the actor's update, the reference's log-prob pass) on 2 gloo CPU ranks; run by the
verl venv's python (tests/trace/setup_verl_venv.sh), started by bench/verl_workers.py:

    PYTHONPATH=. .venvs/verl/bin/python -m memfit.measure.verl_ranks < runs.jsonl   # one JSON run per line

Each rank builds verl's `FSDPEngineWithLMHead` (workers/engine/fsdp/transformer_impl.py) from verl's own config
dataclasses (HFModelConfig, FSDPEngineConfig, FSDPOptimizerConfig, ActorConfig) over a tiny Llama saved to disk, and
makes the engine calls `TrainingWorker.train_batch` / `infer_batch` make (workers/engine_workers.py): the actor's
old log-probs (`eval_mode()`, `infer_batch`, as compute_log_prob runs before the update), its `train_mode()` then `optimizer_zero_grad`, `forward_backward_batch` with verl's `ppo_loss` (workers/utils/losses.py),
`optimizer_step`; the reference (engine forward_only=True, as ref/dp_ref.yaml sets it) `eval_mode()` then
`infer_batch`. Ray, the rollout and vLLM are not involved: the worker's pieces are made directly, one process per rank.

What verl 0.9.1 does that matters to memory (read from the wheel; measured here):
  - precision: the model is built in `engine.model_dtype`, fp32 by default (trainer/config/engine/fsdp.yaml), the
    forward-only reference's too; FSDP1 MixedPrecision / FSDP2 MixedPrecisionPolicy(param_dtype bf16, reduce_dtype
    fp32, buffer fp32) when `engine.mixed_precision` is unset (`_build_fsdp_module`); the forward runs under
    torch.autocast(bf16) (`forward_step`). So shards, sharded gradients and AdamW states are fp32; a unit is
    gathered in bf16; its unsharded gradient is bf16 and is reduced from an fp32 copy.
  - wrapping: FSDP1 `get_fsdp_wrap_policy` (utils/fsdp_utils.py) wraps the decoder layers; the root flat parameter
    holds embedding, final norm and head, never resharded after forward (torch's root). FSDP2 `apply_fsdp2` +
    `_select_fsdp2_wrap_targets`: every decoder layer, embed_tokens and lm_head (untied) their own `fully_shard`
    units, `reshard_after_forward` from engine.reshard_after_forward (default true), then the root (final norm).
    FSDP1's sharding strategy is FULL_SHARD for reshard_after_forward=true (`get_sharding_strategy`).
  - offload: `param_offload` / `optimizer_offload` (actor, critic) move the shards, gradients and optimizer states
    to the host between phases with `offload_fsdp_model_to_cpu` / `offload_fsdp_optimizer` and back with
    `load_fsdp_model_to_gpu` / `load_fsdp_optimizer` when `train_mode()` / `eval_mode()` is entered
    (engine/base.py BaseEngineCtx); during the update everything is on the GPU as without offload. On a CPU those
    moves are no-ops, so no offload row is measured here: its effect is where a role sits between phases.
  - the reference: FSDP1 `CPUOffload(offload_params=True)`, FSDP2 `CPUOffloadPolicy(pin_memory=True)` forced for
    forward_only (and `param_offload` turned off): its fp32 shards live in host RAM, a unit is copied in and
    gathered while it runs. FSDP1's CPUOffload also makes a pinned host gradient buffer of each shard's size.
  - log-probs (`prepare_model_outputs`, remove-padding: `use_remove_padding` true in ppo_trainer.yaml, the batch is
    one packed row of tokens): the head's bf16 logits, scaled only when the temperature is not 1; log-probs by
    `logprobs_from_logits` (utils/torch_functional.py): flash-attn's triton cross entropy with inplace_backward when
    flash-attn is installed, else `logprobs_from_logits_v2` (bf16: one log_softmax per token row). Entropy only when
    the loss asks for it (`calculate_entropy`), chunked with `entropy_from_logits_with_chunking`, checkpointed with
    `entropy_checkpointing`; not run here (entropy_coeff 0).
  - AdamW: `build_optimizer` makes torch.optim.AdamW with no foreach / fused argument: foreach on CUDA, the
    single-tensor loop on a CPU (two temporaries of the largest tensor, measured).

Patches, each only what a CPU lacks (the code that runs is verl's and torch's):
  1. verl's platform: a CPU platform (device "cpu", backend gloo, no cache to empty) set with `set_platform`; verl's
     auto-detection falls back to "nvidia" without a GPU.
  2. verl.utils.dataset is entered without its __init__ (which imports Pillow for multi-modal datasets; none is read).
  3. attention: `override_config={"attn_implementation": "sdpa"}` (verl's default flash_attention_2 is CUDA-only); a
     config key verl has, not a patch of code. The layers' activations are a CPU SDPA's (small here).
  4. `monkey_patch.is_trl_available` false: the installed TRL lacks the value-head class verl re-binds (not used).
  5. FSDP2's CPUOffloadPolicy(pin_memory=False) for the reference: pinning needs an accelerator.
  6. FSDP1's refusal to broadcast CPU module states (sync_module_states) is skipped; gloo broadcasts them.
  7. `Tensor.pin_memory` makes a plain copy, marked pinned for the tracker (FSDP1 CPUOffload pins in torch itself).
Every storage is counted by memfit.measure.tracker; the engine's objects are claimed by category and side.
"""
from __future__ import annotations

import os
import sys

from memfit.measure.ranks import claim_states, patch_fsdp1, runner_main

ROOTS = ("/torch/distributed/", "/torch/optim/", "/torch/utils/checkpoint", "/verl/", "/peft/", "/transformers/")
MODEL_DIR = "/tmp/memfit-verl-model"


class _CPUDeviceModule:
    """torch.cpu with what verl calls on torch.cuda: no cache to empty, no allocator counters (the tracker counts)."""

    def __getattr__(self, name):
        import torch

        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name in ("empty_cache", "reset_peak_memory_stats", "ipc_collect"):
            return lambda *a, **k: None
        if name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
            return lambda *a, **k: 0
        if name == "mem_get_info":
            return lambda *a, **k: (0, 1)
        raise AttributeError(name)


_CPU_DEVICE_MODULE = _CPUDeviceModule()


def _cpu_platform():
    """verl's platform for a CPU (patch 1): its auto-detection falls back to 'nvidia' without a GPU."""
    import torch
    from verl.plugin.platform.platform_cuda import PlatformCUDA

    class PlatformCPU(PlatformCUDA):
        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def device_module(self):
            return _CPU_DEVICE_MODULE

        def is_available(self) -> bool:
            return True

        def current_device(self):
            return torch.device("cpu")

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index) -> None:
            pass

        def synchronize(self, device_index=None) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def communication_backend_name(self) -> str:
            return "gloo"

    return PlatformCPU()


def _skip_dataset_init() -> None:
    """verl's dataset package imports its RL datasets (Pillow, datasets) in its __init__; the FSDP engine imports the
    package for one enum (dataset_utils.DatasetPadMode). The package is entered without its __init__ (patch 2): the
    venv has no Pillow and no dataset is read here."""
    import importlib.util
    import types

    if "verl.utils.dataset" not in sys.modules:
        spec = importlib.util.find_spec("verl.utils")
        assert spec is not None and spec.origin is not None, "verl is not importable in this environment"
        package = types.ModuleType("verl.utils.dataset")
        package.__path__ = [os.path.join(os.path.dirname(spec.origin), "dataset")]
        sys.modules["verl.utils.dataset"] = package


def _unpinned_offload_policy() -> None:
    """patch 5: the reference's FSDP2 CPUOffloadPolicy(pin_memory=True) (transformer_impl.py `_build_fsdp_module`)
    pins its host shards, which needs an accelerator; on the CPU they stay unpinned. Where they live is the same."""
    from verl.workers.engine.fsdp import transformer_impl

    policy = transformer_impl.CPUOffloadPolicy

    def unpinned(pin_memory: bool = True):
        return policy(pin_memory=False)

    transformer_impl.CPUOffloadPolicy = unpinned


def _sync_states_on_cpu() -> None:
    """patch 6: verl's FSDP1 wrap builds the model on rank 0 only (the others on meta, materialized empty by its
    `init_fn`) and broadcasts rank 0's weights with sync_module_states=True; torch refuses that broadcast for CPU
    tensors (fsdp/_init_utils.py `_check_module_states_for_sync_module_states`), which gloo does. The check is
    skipped; the broadcast is the same."""
    from torch.distributed.fsdp import _init_utils

    _init_utils._check_module_states_for_sync_module_states = lambda module_states: None


def _pin_as_copy(get_tracker) -> None:
    """patch 7: `Tensor.pin_memory` needs an accelerator. FSDP1's CPUOffload pins the host shard and a host gradient
    buffer (torch fsdp/_flat_param.py `init_flat_param_attributes`); here it makes the same copy in plain RAM and the
    tracker marks it pinned."""
    import torch

    def pin_memory(tensor, *args, **kwargs):
        copy = tensor.clone()
        tracker = get_tracker()
        if tracker is not None:
            tracker.mark_pinned(copy)
        return copy

    torch.Tensor.pin_memory = pin_memory  # type: ignore[method-assign,assignment]


def _claim_reference(tk, module) -> None:
    """The reference's shards live on the host (FSDP1 CPUOffload(offload_params=True), FSDP2 CPUOffloadPolicy): its
    sharded parameters are host memory, its gathered ones (FSDP1's padded unsharded flat parameter) device memory."""
    for p in module.parameters():
        tk.claim(p if hasattr(p, "_local_tensor") else p.data, "weights", "host", "reference.shards")
    for m in module.modules():
        flat = getattr(m, "_flat_param", None)
        if flat is not None:
            tk.claim(flat.data, "weights", "host", "reference.flat_shard")
            for name in ("_local_shard", "_cpu_grad"):  # the pinned host shard and gradient buffer (CPUOffload)
                if getattr(flat, name, None) is not None:
                    tk.claim(getattr(flat, name), "weights", "host", f"reference.{name.strip('_')}")
            if getattr(flat, "_mp_shard", None) is not None:  # the shard cast to bf16 on the device
                tk.claim(flat._mp_shard, "weights", "device", "reference.mp_shard")
            if getattr(flat, "_full_param_padded", None) is not None:
                tk.claim(flat._full_param_padded, "weights", "device", "reference.unsharded_flat_param")
    for b in module.buffers():
        tk.claim(b, "weights", "device", "module.buffers")


def _save_model(run: dict, path: str) -> None:
    """The tiny Llama verl's engine loads with from_pretrained (fp32 weights on disk; verl casts to its model_dtype)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d = run["dims"]
    config = LlamaConfig(hidden_size=d["hidden"], num_hidden_layers=d["layers"], num_attention_heads=d["heads"],
                         num_key_value_heads=d["kv_heads"], intermediate_size=d["inter"], vocab_size=d["vocab"],
                         tie_word_embeddings=False, max_position_embeddings=4096)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)


def _engine(run: dict, path: str, forward_only: bool):
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    model_config = HFModelConfig(path=path, load_tokenizer=False, use_remove_padding=True,
                                 enable_gradient_checkpointing=run.get("checkpointing", True),
                                 lora_rank=8 if run["tuning"] == "lora" else 0,
                                 override_config={"attn_implementation": "sdpa"})  # patch 3: flash-attn is CUDA-only
    engine_config = FSDPEngineConfig(strategy=run["strategy"], forward_only=forward_only,
                                     param_offload=run.get("param_offload", False),
                                     optimizer_offload=run.get("optimizer_offload", False),
                                     use_dynamic_bsz=False, micro_batch_size_per_gpu=run["micro_batch"],
                                     infer_micro_batch_size_per_gpu=run["micro_batch"])
    engine_config.use_remove_padding = True  # TrainingWorker copies the model's flag (engine_workers.py)
    optimizer_config = FSDPOptimizerConfig(lr=1e-6, total_training_steps=run["steps"])
    engine = FSDPEngineWithLMHead(model_config=model_config, engine_config=engine_config,
                                  optimizer_config=optimizer_config, checkpoint_config=CheckpointConfig())
    engine.initialize()
    return engine


def _batch(run: dict, vocab: int, rank: int):
    """A rollout's batch as the trainer hands it to the actor: prompts + responses, no padding (jagged)."""
    import torch
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    gen = torch.Generator().manual_seed(rank)
    b, seq = run["micro_batch"], run["seq_len"]
    response = seq // 2
    ids = torch.randint(0, vocab, (b, seq), generator=gen)
    mask = torch.ones(b, seq, dtype=torch.long)
    data = DataProto.from_single_dict(
        {"input_ids": ids, "prompts": ids[:, :response], "attention_mask": mask,
         "position_ids": torch.arange(seq).expand(b, seq).clone(), "responses": ids[:, response:],
         "response_mask": mask[:, response:], "old_log_probs": torch.zeros(b, seq - response),
         "advantages": torch.rand(b, seq - response, generator=gen)},
        meta_info={"temperature": 1.0, "global_token_num": [seq] * b})
    td = left_right_2_no_padding(data.to_tensordict())
    tu.assign_non_tensor(td, global_batch_size=b * 2, use_remove_padding=True, use_dynamic_bsz=False,
                         micro_batch_size_per_gpu=run["micro_batch"], max_token_len_per_gpu=None,
                         use_fused_kernels=False)
    return td


def _loss(run: dict):
    from functools import partial

    from verl.workers.config import ActorConfig
    from verl.workers.utils.losses import ppo_loss

    config = ActorConfig(strategy=run["strategy"], rollout_n=1, ppo_micro_batch_size_per_gpu=run["micro_batch"],
                         ppo_mini_batch_size=run["micro_batch"] * 2, use_kl_loss=False)
    return partial(ppo_loss, config=config)


def _peak_snaps(tk, step: int, side: str = "device") -> dict:
    """The last step's peak of each phase (the tracker's snapshot)."""
    phases = {}
    for phase in ("forward", "backward", "optimizer_step"):
        snaps = [snap for (st, ph, sd), snap in tk.peaks.items() if st == step and sd == side and ph == phase]
        if snaps:
            phases[phase] = max(snaps, key=lambda x: x.total)
    return phases


def _peaks(tk, step: int, side: str = "device") -> dict:
    """The last step's peak of each phase, by category."""
    return {phase: dict(snap.parts) for phase, snap in _peak_snaps(tk, step, side).items()}


def _sites(tk, step: int, side: str = "device") -> dict:
    """The largest allocation sites alive at each phase's peak (what the bench's reader looks at first)."""
    return {phase: dict(sorted(snap.sites.items(), key=lambda kv: -kv[1])[:10])
            for phase, snap in _peak_snaps(tk, step, side).items()}


def run_rank(run: dict) -> dict:
    import torch

    from memfit.measure.patches import install_patches
    from memfit.measure.tracker import MemoryTracker
    from verl.plugin.platform import platform_manager

    _skip_dataset_init()
    platform_manager.set_platform(_cpu_platform())
    # patch 4: the main environment's TRL has no AutoModelForCausalLMWithValueHead, whose state_dict verl re-binds for
    # value models (models/transformers/monkey_patch.py); an actor and a reference are no value model
    from verl.models.transformers import monkey_patch

    monkey_patch.is_trl_available = lambda: False
    _unpinned_offload_policy()
    _sync_states_on_cpu()
    current: dict = {"tk": None}
    _pin_as_copy(lambda: current["tk"])
    install_patches(lambda: current["tk"])
    patch_fsdp1(lambda: current["tk"])
    rank = int(os.environ["RANK"])
    torch.distributed.init_process_group("gloo")
    path = f"{MODEL_DIR}-{os.getppid()}"  # the launcher's: the same for both ranks
    if rank == 0:
        _save_model(run, path)
    torch.distributed.barrier()
    tk = MemoryTracker(roots=ROOTS)
    tk.rules.insert(0, ("fsdp/_flat_param.py:init_flat_param_attributes", "weights", "device"))
    # FSDP2 under CPUOffloadPolicy copies a host shard to the device, then casts it to bf16 for the all-gather
    # (_fsdp_param.py all_gather_inputs); on a CPU the copy is a no-op and the cast would pass for a host tensor
    tk.rules.insert(0, ("_fully_shard/_fsdp_common.py:_to_dtype_if_needed", "engine_buffers", "device"))
    current["tk"] = tk
    with tk:
        tk.set_phase("load", 0)
        if run["role"] == "actor":
            _actor_steps(run, tk, path, rank)
        else:
            _ref_passes(run, tk, path, rank)
        tk.set_phase("done", run["steps"] + 1)
    current["tk"] = None
    from importlib.metadata import version

    phases, host = _peaks(tk, run["steps"]), _peaks(tk, run["steps"], "host")
    sites, host_sites = _sites(tk, run["steps"]), _sites(tk, run["steps"], "host")
    if run["role"] == "ref":  # its one pass, forward only under no_grad
        phases, host, sites, host_sites = ({"ref_log_prob": d["forward"]} if d else {}
                                           for d in (phases, host, sites, host_sites))
    else:  # the actor's old log-probs, before its update
        phases["old_log_prob"] = _peaks(tk, -run["steps"])["forward"]
        sites["old_log_prob"] = _sites(tk, -run["steps"])["forward"]
    return {"rank": rank, "phases": phases, "host_phases": host, "sites": sites, "host_sites": host_sites,
            "versions": {name: version(name) for name in ("torch", "transformers", "verl", "peft")}}


def _actor_steps(run: dict, tk, path: str, rank: int) -> None:
    """TrainingWorker.train_batch's engine calls: train_mode(), engine.train_batch (zero_grad, forward_backward_batch
    with ppo_loss, optimizer_step), the mode's exit (offload back to the host where configured)."""
    engine = _engine(run, path, forward_only=False)
    ppo_loss = _loss(run)
    vocab = run["dims"]["vocab"]
    for step in range(1, run["steps"] + 1):
        data = _batch(run, vocab, rank)
        claim_states(tk, engine.module, engine.optimizer)
        # the old policy's log-probs first (ActorRolloutRefWorker.compute_log_prob: eval_mode(), infer_batch), kept
        # as step -N with the tracker's forward labels
        tk.set_phase("forward", -step)
        with engine.eval_mode():
            engine.infer_batch(data, loss_function=None)
        tk.set_phase("forward", step)

        def loss(*args, _step=step, **kwargs):  # verl's loss; its backward starts when it returns
            out = ppo_loss(*args, **kwargs)
            tk.set_phase("backward", _step)
            return out

        with engine.train_mode():
            engine.optimizer_zero_grad()
            engine.forward_backward_batch(data, loss, forward_only=False)
            claim_states(tk, engine.module, engine.optimizer)
            tk.set_phase("optimizer_step", step)
            engine.optimizer_step()
        del data


def _ref_passes(run: dict, tk, path: str, rank: int) -> None:
    """TrainingWorker.infer_batch's engine calls for the reference: eval_mode(), engine.infer_batch (no loss)."""
    engine = _engine(run, path, forward_only=True)
    vocab = run["dims"]["vocab"]
    for step in range(1, run["steps"] + 1):
        data = _batch(run, vocab, rank)
        _claim_reference(tk, engine.module)
        tk.set_phase("forward", step)  # the tracker's forward labels: activations, no gradients
        with engine.eval_mode():
            engine.infer_batch(data, loss_function=None)
        del data



def main(argv: list[str]) -> int:
    return runner_main(argv, "memfit.measure.verl_ranks", run_rank)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
