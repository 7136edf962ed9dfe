"""LitGPT's several-device finetuning run for real on 2 gloo ranks (CPU), memory by category per rank.

    python -m memfit.measure.litgpt_ranks RUN_JSON OUT.json     # in LitGPT's venv (PYTHONPATH=repo root)

Starts one process per rank (RANK / LOCAL_RANK / WORLD_SIZE / MASTER_* set, so Fabric's LightningEnvironment
takes the processes as launched externally) and has each run what litgpt 0.5.x `finetune/{lora,full,adapter,
adapter_v2}.py` does with devices > 1:
  - the script's own strategy: lora.py `ModelParallelStrategy(parallelize_fn=litgpt.finetune.lora.parallelize_fn,
    data_parallel_size=devices, tensor_parallel_size=1)`; full.py / adapter*.py `FSDPStrategy(auto_wrap_policy={Block},
    activation_checkpointing_policy={Block}, state_dict_type="full", limit_all_gathers=True, cpu_offload=False)`;
  - `fabric.init_module(empty_init=True)` (the meta device), `mark_only_*_as_trainable`, `fabric.setup_module` (or
    `fabric.setup` for full), `instantiate_torch_optimizer("AdamW", model.parameters())` (torch defaults; foreach as
    torch picks on CUDA), `fabric.setup_optimizers`; `model.max_seq_length = seq_len` as fit() does;
  - fit()'s sanity-check validation (two no-grad batches), then steps of: forward (lm_head_chunk_size=128 but for
    full), litgpt's `chunked_cross_entropy`, `fabric.backward`, `optimizer.step()`, `optimizer.zero_grad()`.
No checkpoint is loaded (random init: the weights' values do not change what is allocated). Every storage the
run makes is counted by memfit.measure.tracker (a TorchDispatchMode); on a CPU every tensor is "device".

bf16-mixed (the scripts' default, utils.py get_default_supported_precision(training=True)): on a GPU Fabric runs the
forward in a CUDA autocast region (FSDPPrecision.forward_context: torch.autocast("cuda"); under ModelParallelStrategy
the connector's MixedPrecision(device="cuda")). On the CPU that region would do nothing (FSDP1) or follow the CPU's op
lists (FSDP2), so the forward runs in a CPU bf16 region with CUDA's lists applied on top (memfit.trace.autocast
CudaAutocastPolicy, as the single-device trace does); see `_cuda_autocast_on_cpu`.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from memfit.errors import MemfitError
from memfit.measure.ranks import claim_states, patch_fsdp1, replaced, runner_main

if TYPE_CHECKING:
    import torch

HEAD_CHUNK = 128  # finetune/{lora,adapter,adapter_v2}.py: model(input_ids, lm_head_chunk_size=128)
ROOTS = ("/torch/distributed/", "/torch/optim/", "/torch/utils/checkpoint", "/litgpt/", "/lightning/")


def _modules(method: str):
    """(litgpt module of the method's GPT, Block, mark-trainable function)."""
    import litgpt.model as base

    if method == "full":
        return base, lambda model: None
    import importlib

    m = importlib.import_module({"lora": "litgpt.lora", "adapter": "litgpt.adapter",
                                 "adapter_v2": "litgpt.adapter_v2"}[method])
    mark = {"lora": "mark_only_lora_as_trainable", "adapter": "mark_only_adapter_as_trainable",
            "adapter_v2": "mark_only_adapter_v2_as_trainable"}[method]
    return m, getattr(m, mark)


def strategy_for(method: str):
    """The strategy the finetune script picks when devices * num_nodes > 1 (litgpt 0.5.13)."""
    if method == "lora":
        from lightning.fabric.strategies import ModelParallelStrategy
        from litgpt.finetune.lora import parallelize_fn

        return ModelParallelStrategy(parallelize_fn=parallelize_fn, data_parallel_size=2, tensor_parallel_size=1)
    import torch
    from lightning.fabric.strategies import FSDPStrategy

    class CpuFSDPStrategy(FSDPStrategy):
        """FSDPStrategy itself, let onto the CPU: Fabric's connector refuses `type(strategy) is FSDPStrategy` off a
        GPU (a subclass passes), and FSDP1 refuses device_id=None (`root_device.index` of the CPU) without an
        accelerator, so the CPU is named as the device. Nothing else changes."""

        def setup_module(self, module):
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            original: Callable[..., None] = FSDP.__init__  # called with what the caller passed

            def init(fsdp, *args, device_id=None, **kwargs):
                original(fsdp, *args, device_id=device_id if device_id is not None else torch.device("cpu"), **kwargs)

            with replaced(FSDP, "__init__", init):
                return super().setup_module(module)

    module, _ = _modules(method)
    return CpuFSDPStrategy(auto_wrap_policy={module.Block}, activation_checkpointing_policy={module.Block},
                        state_dict_type="full", limit_all_gathers=True, cpu_offload=False,
                        process_group_backend="gloo")


def _cuda_autocast_on_cpu(fabric, precision: str):
    """The forward context a GPU run of this precision would enter, on the CPU: a CPU autocast region in its place
    (the policy entered around the whole loop makes its op lists CUDA's; it acts only inside a region, so it stays
    on through backward, where checkpoint recomputes forward under the CPU autocast state it saved)."""
    import torch

    if "mixed" not in precision:
        return
    dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float16
    fabric.strategy.precision.forward_context = lambda: torch.autocast("cpu", dtype=dtype)


def _lm_head(model: torch.nn.Module) -> torch.nn.Module:
    """The GPT's lm_head: on the module Fabric set up, or on the one its wrapper holds (`.module`)."""
    import torch

    head = getattr(model, "lm_head", None)
    if head is None:
        head = getattr(getattr(model, "module", None), "lm_head", None)
    if not isinstance(head, torch.nn.Module):
        raise MemfitError(f"litgpt_ranks: {type(model).__name__} has no lm_head module (litgpt's GPT has one)")
    return head


def run_rank(run: dict) -> dict:
    import lightning as L
    import torch

    from memfit.measure.patches import install_patches
    from memfit.measure.tracker import MemoryTracker

    current: dict[str, MemoryTracker | None] = {"tk": None}
    install_patches(lambda: current["tk"])
    patch_fsdp1(lambda: current["tk"])
    method = run["method"]
    module, mark_trainable = _modules(method)
    kwargs = dict(run["config"])
    if method == "lora":  # finetune/lora.py setup() defaults
        kwargs |= {"lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "lora_query": True, "lora_key": False,
                   "lora_value": True, "lora_projection": False, "lora_mlp": False, "lora_head": False}
    config = module.Config(**kwargs)
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=strategy_for(method), precision=run["precision"])
    fabric.launch()
    fabric.seed_everything(1337)
    _cuda_autocast_on_cpu(fabric, run["precision"])
    from memfit.trace.autocast import CudaAutocastPolicy
    tk = MemoryTracker(roots=ROOTS)
    # FSDP1's unsharded flat parameters are made once at its lazy init (the root's before any claim sees it) and then
    # resized between 0 and full: gathered weights
    tk.rules.insert(0, ("fsdp/_flat_param.py:init_flat_param_attributes", "weights", "device"))
    current["tk"] = tk
    vocab = config.padded_vocab_size
    mb, seq = run["micro_batch"], run["seq_len"]
    from litgpt.utils import chunked_cross_entropy, instantiate_torch_optimizer

    with tk, CudaAutocastPolicy():
        tk.set_phase("load", 0)
        with fabric.init_module(empty_init=(fabric.world_size > 1)):
            gpt = module.GPT(config)
        mark_trainable(gpt)
        trainable = sum(p.numel() for p in gpt.parameters() if p.requires_grad)
        params = sum(p.numel() for p in gpt.parameters())
        # full.py: fabric.setup(model); the others setup_module (the same for a model without an optimizer)
        model = fabric.setup_module(gpt)
        # torch picks foreach for CUDA params (optim/optimizer.py _default_to_fused_or_foreach); on the CPU it
        # would not, so it is asked for: the step's temporaries are a CUDA run's
        torch_optimizer = instantiate_torch_optimizer("AdamW", model.parameters())
        for group in torch_optimizer.param_groups:
            group["foreach"] = True
        optimizer = fabric.setup_optimizers(torch_optimizer)
        if isinstance(optimizer, tuple):  # Fabric returns a tuple for several optimizers, one for one
            raise MemfitError(f"litgpt_ranks: Fabric set up {len(optimizer)} optimizers for the one AdamW")
        model.max_seq_length = seq  # fit(): min(longest sequence, train.max_seq_length)
        raw: torch.nn.Module = model.module if hasattr(model, "module") else gpt
        claim_states(tk, raw, optimizer.optimizer)
        head = _lm_head(raw)

        def enter_logits(mod, args):
            tk.context = "logits"
            hidden = args[0]
            if hidden.requires_grad and not getattr(hidden, "_memfit_hooked", False):
                hidden.register_hook(lambda grad: setattr(tk, "context", None))
                hidden._memfit_hooked = True

        head.register_forward_pre_hook(enter_logits)
        blocks = [m for m in raw.modules() if type(m).__name__ == "Block"]

        def layer_phase(index):
            # backward's peak by layer: a sub-phase starts when the gradient reaches a Block's output (recomputes,
            # which run in backward, register nothing)
            def hook(mod, args, out):
                if tk.phase == "forward" and torch.is_grad_enabled() and out.requires_grad:
                    step = tk.step
                    out.register_hook(lambda grad: tk.set_phase("backward", step=f"{step}.L{index}"))
            return hook

        for i, block in enumerate(blocks):
            block.register_forward_hook(layer_phase(i))
        gen = torch.Generator().manual_seed(fabric.global_rank)
        model.eval()  # fit(): validate(max_iters=2) before training (no_grad; the adapters cache their prompt k/v)
        with torch.no_grad():
            for _ in range(2):
                ids = torch.randint(0, vocab, (mb, seq), generator=gen)
                logits = model(ids)
                chunked_cross_entropy(logits[..., :-1, :], ids[..., 1:], chunk_size=0)
                del logits
        tk.context = None
        model.train()
        logits = None  # fit()'s loop variable: alive until the next forward returns
        for step in range(1, run["steps"] + 1):
            claim_states(tk, raw, optimizer.optimizer)
            tk.set_phase("forward", step)
            ids = torch.randint(0, vocab, (mb, seq), generator=gen)
            targets = ids.clone()
            if method == "full":
                logits = model(ids)
                loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
            else:
                logits = model(ids, lm_head_chunk_size=HEAD_CHUNK)
                logits[-1] = logits[-1][..., :-1, :]
                loss = chunked_cross_entropy(logits, targets[..., 1:])
            tk.context = None
            tk.set_phase("backward", step)
            tk.context = "logits"
            fabric.backward(loss)
            tk.context = None
            claim_states(tk, raw, optimizer.optimizer)
            tk.set_phase("optimizer_step", step)
            optimizer.step()
            optimizer.zero_grad()
            del loss, ids, targets
        claim_states(tk, raw, optimizer.optimizer)
        tk.set_phase("done", run["steps"] + 1)
    current["tk"] = None
    last = run["steps"]
    phases = {}
    sites = {}
    subphases = {}  # backward before any layer (the loss and the head), and from each layer's on (by layer)
    for (at, phase, side), snap in tk.peaks.items():
        if str(at).split(".")[0] == str(last) and side == "device" and phase == "backward":
            subphases[str(at).partition(".")[2] or "head"] = dict(snap.parts)
    for phase in ("forward", "backward", "optimizer_step"):
        snaps = [snap for (step, ph, side), snap in tk.peaks.items()
                 if str(step).split(".")[0] == str(last) and side == "device" and ph == phase]
        if snaps:
            snap = max(snaps, key=lambda x: x.total)
            phases[phase] = dict(snap.parts)
            sites[phase] = dict(sorted(snap.sites.items(), key=lambda kv: -kv[1])[:12])
    from importlib.metadata import version

    return {"rank": fabric.global_rank, "phases": phases, "backward_by_layer": subphases, "sites": sites, "params": params, "trainable": trainable,
            "peak": max(sum(p.values()) for p in phases.values()),
            "versions": {"litgpt": version("litgpt"), "torch": torch.__version__.split("+")[0],
                         "lightning": version("lightning")}}


def main(argv: list[str]) -> int:
    return runner_main(argv, "memfit.measure.litgpt_ranks", run_rank)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
