"""torchtune's distributed recipes measured for real: one rank, `python -m memfit.measure.torchtune_recipe JOBS.pkl OUT`.

Runs in torchtune's venv (tests/trace/setup_torchtune_venv.sh), one process per rank on gloo (bench/torchtune_distributed.py
starts them). Each job is a torchtune-profile Scenario of a small model; the rank does what torchtune 0.6.1's
full_finetune_distributed.py / lora_finetune_distributed.py do, with the library calls they make:

- `_setup_model`: the model built by torchtune's component builder on the meta device under
  `training.set_default_dtype(bf16)`; LoRA: `set_trainable_params(model, get_adapter_params(model))`;
  `training.set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})` when on;
  `training.shard_model` with `get_shard_conditions` (fully_shard on every `layers.i`, then the root, no
  MixedPrecisionPolicy: bf16 params, bf16 gradient reduction), `reshard_after_forward` = fsdp_reshard_after_forward;
  the full recipe passes its ("dp", "tp") mesh's dp dimension; RoPE caches by `rope_init`, LoRA params by
  `to_empty` + `initialize_parameters`, and the weights by `training.load_from_full_model_state_dict`.
- the optimizer: `torch.optim.AdamW(model.parameters(), fused=True)` (every llama3* distributed config); with
  `optimizer_in_bwd: True` (full_finetune_distributed.py `_setup_optimizer`) one AdamW per parameter
  (`{p: AdamW([p]) for p in model.parameters()}`), `training.register_optim_in_bwd_hooks` (a post-accumulate-grad
  hook on each sharded parameter: step, zero_grad, which FSDP2's foreach_reduce runs right after the parameter's
  reduce-scatter) and `training.create_optim_in_bwd_wrapper`; `train` zero_grads every one of them first.
- `train`: the labels shifted with an ignore column, CEWithChunkedOutputLoss after `model.set_num_output_chunks`,
  times the token count, backward, the all-reduced token count, `training.scale_grads(model, world / tokens)`,
  step, `zero_grad(set_to_none=True)` (clip_grad_norm is null in those configs). With optimizer_in_bwd the token
  count is all-reduced before backward and the loss scaled by world / tokens instead; backward steps the params.
- `fsdp_cpu_offload: True`: shard_model's CPUOffloadPolicy() (pin_memory=True) and
  load_from_full_model_state_dict(cpu_offload=True), as both recipes pass it; the LoRA params `to_empty` on "cpu".
  A CPU-only torch cannot pin (`Tensor.pin_memory` raises without an accelerator), so while an offload job runs
  `pin_memory` returns the tensor itself and the tracker marks it pinned. The sharded params, their grads and the
  optimizer states are claimed as host memory; on a CPU run FSDP2's device copies of an offloaded shard
  (`sharded_param_data.to(device)` before the all-gather, the reduce-scatter output before its `.to("cpu")`) are
  no-ops, so those transients (at most one unit's shard) are not seen. `training.set_torch_num_threads()` (speed
  only) is left out.

Memory is the tracker's (memfit/measure/tracker.py): every storage by category, the engine's objects claimed
after each phase. Each rank writes OUT/job{i}.rank{r}.json: its per-phase peak breakdown of steps 2..N, on the device
("phases") and on the host ("host_phases": what the run keeps in host RAM, the offloaded shards).
"""
from __future__ import annotations

import json
import os
import pickle
import sys
import time
import traceback
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from memfit.measure.patches import install_patches
from memfit.measure.ranks import pinning_marked
from memfit.measure.tracker import MemoryTracker

IGNORE_INDEX = -100
LR = 2e-5
PHASES = ("forward", "backward", "optimizer_step")
ROOTS = ("/torch/distributed/", "/torch/optim/", "/torch/nn/parallel/", "/torchtune/")


def build_model(s, tk: MemoryTracker):
    """The recipe's `_setup_model`: meta build, trainable set, checkpointing, shard_model, materialize, load."""
    import importlib

    from torchtune import modules, training
    from torchtune.modules.peft import LoRALinear, get_adapter_params, set_trainable_params

    from memfit.trace.torchtune import _model_kwargs, builder_name, lora_kwargs

    name = builder_name(s.model)
    builders = importlib.import_module(f"torchtune.models.{name}._component_builders")
    kwargs = _model_kwargs(s.model, name)
    lora = s.tuning == "lora"
    if lora:
        kwargs |= lora_kwargs(s)
    make = getattr(builders, f"lora_{name}" if lora else name)
    with training.set_default_dtype(torch.bfloat16), torch.device("meta"):
        model = make(**kwargs)
    if lora:
        set_trainable_params(model, get_adapter_params(model))
    if s.checkpointing == "full":
        training.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
    mesh = None
    if not lora:  # full_finetune_distributed.py: init_device_mesh(("dp", "tp")), shard_model(dp_mesh=mesh["dp"])
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", mesh_shape=(dist.get_world_size(), 1), mesh_dim_names=("dp", "tp"))["dp"]
    training.shard_model(model=model, shard_conditions=[partial(training.get_shard_conditions, names_to_match=None)],
                         cpu_offload=s.fsdp_cpu_offload, reshard_after_forward=s.fsdp_strategy != "shard_grad_op",
                         dp_mesh=mesh)
    # the checkpoint the recipe loads: a full bf16 state dict on every rank (torch.load(mmap=True) there), here
    # the same builder's random weights; host RAM while it lives, never recorded
    tk.context = "build"
    torch.manual_seed(0)
    with training.set_default_dtype(torch.bfloat16):
        full = make(**kwargs)
    full_sd = {k: v for k, v in full.state_dict().items() if not (lora and ("lora_a" in k or "lora_b" in k))}
    with training.set_default_dtype(torch.bfloat16), torch.device("cpu"):
        for m in model.modules():
            if lora and isinstance(m, LoRALinear):
                m.to_empty(device="cpu")
                m.initialize_parameters()
            if hasattr(m, "rope_init"):
                m.rope_init()
    training.load_from_full_model_state_dict(model, full_sd, torch.device("cpu"), strict=not lora,
                                             cpu_offload=s.fsdp_cpu_offload)
    del full, full_sd
    tk.context = None
    training.validate_no_params_on_meta_device(model)
    return model


class Recipe:
    def __init__(self, s, tk: MemoryTracker):
        from torchtune.modules.loss import CEWithChunkedOutputLoss

        self.s, self.tk = s, tk
        self.model = build_model(s, tk)
        if s.optimizer_in_backward:  # full_finetune_distributed.py `_setup_optimizer(optimizer_in_bwd=True)`
            from torchtune import training

            self.optimizer = None
            self.optim_dict = {p: torch.optim.AdamW([p], lr=LR, weight_decay=0.01, fused=True)
                               for p in self.model.parameters()}
            training.register_optim_in_bwd_hooks(model=self.model, optim_dict=self.optim_dict)
            self.optim_wrapper = training.create_optim_in_bwd_wrapper(model=self.model, optim_dict=self.optim_dict)
            for opt in self.optim_dict.values():  # train(): zero_grad every in-backward optimizer first
                opt.zero_grad()
        else:
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR, weight_decay=0.01, fused=True)
            self.optim_dict = {}
        if s.loss == "chunked_output":
            self.loss_fn = CEWithChunkedOutputLoss(ignore_index=IGNORE_INDEX)
            self.model.set_num_output_chunks(self.loss_fn.num_output_chunks)
        else:  # loss._component_: torch.nn.CrossEntropyLoss (the model then returns one fp32 logits tensor)
            self.loss_fn = torch.nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX)
        self.ignore_labels_cache = torch.full((s.micro_batch, 1), IGNORE_INDEX)
        self._hooks()

    def _hooks(self) -> None:
        """The output projection + loss is logits_loss, from the final norm's output until its gradient."""
        tk = self.tk

        def after_norm(module, args, out):
            tk.context = "logits"
            if out.requires_grad:
                out.register_hook(lambda grad: setattr(tk, "context", None))

        self.model.norm.register_forward_hook(after_norm)

    def walk(self) -> None:
        tk, side = self.tk, "host" if self.s.fsdp_cpu_offload else "device"
        for p in self.model.parameters():
            tk.claim(p, "weights", side, "module.params")
            if p.grad is not None:
                tk.claim(p.grad, "gradients", side, "param.grad")
        for b in self.model.buffers():
            tk.claim(b, "weights", "device", "module.buffers")
        optimizers = [self.optimizer] if self.optimizer is not None else list(self.optim_dict.values())
        for state in (st for opt in optimizers for st in opt.state.values()):
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    tk.claim(value, "optimizer_states", side, f"optimizer.state.{key}")

    def step(self, step: int, generator: torch.Generator) -> None:
        from torchtune import training

        s, tk = self.s, self.tk
        tk.set_phase("forward", step)
        tokens = torch.randint(0, s.model.vocab_size, (s.micro_batch, s.seq_len), generator=generator)
        labels = tokens.clone()
        num_tokens = (labels != IGNORE_INDEX).sum()
        logits = self.model(tokens)
        labels = torch.hstack((labels[..., 1:], self.ignore_labels_cache[: labels.shape[0]]))
        if not isinstance(logits, list):
            labels = labels.reshape(-1)
            logits = logits.reshape(-1, logits.size(-1))
        loss = self.loss_fn(logits, labels) * num_tokens
        del logits, tokens, labels
        tk.context = None
        tk.set_phase("backward")
        if s.optimizer_in_backward:  # normalized before backward, which steps every parameter
            dist.all_reduce(num_tokens)
            loss = loss * (dist.get_world_size() / num_tokens)
        tk.context = "logits"
        loss.backward()
        tk.context = None
        del loss
        self.walk()
        tk.set_phase("optimizer_step")
        if self.optimizer is not None:  # none with optimizer_in_backward: backward stepped every parameter
            dist.all_reduce(num_tokens)
            training.scale_grads(self.model, dist.get_world_size() / num_tokens)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.walk()


def _profile(tk: MemoryTracker, steps: int, side: str = "device") -> dict:
    """Per step phase: the largest peak over steps 2..N (step 1 makes AdamW's state), by category."""
    out = {}
    for phase in PHASES:
        snaps = [tk.peaks[k] for k in ((st, phase, side) for st in range(2, steps + 1)) if k in tk.peaks]
        if snaps:
            best = max(snaps, key=lambda c: c.total)
            top = sorted(best.sites.items(), key=lambda kv: -kv[1])[:8]
            out[phase] = {"total": best.total, "parts": dict(best.parts), "sites": dict(top)}
    return out


def run_job(s, steps: int, rank: int) -> dict:
    tk = MemoryTracker(roots=ROOTS)
    install_patches(lambda: tk)
    started = time.time()
    with tk, pinning_marked(tk, s.fsdp_cpu_offload):
        tk.record = False
        tk.set_phase("load", 0)
        recipe = Recipe(s, tk)
        recipe.walk()
        params = sum(p.numel() for p in recipe.model.parameters())
        trainable = sum(p.numel() for p in recipe.model.parameters() if p.requires_grad)
        tk.record = True
        generator = torch.Generator().manual_seed(1234 + rank)
        for step in range(1, steps + 1):
            recipe.step(step, generator)
        profile, host = _profile(tk, steps), _profile(tk, steps, "host")
        del recipe
    return {"rank": rank, "phases": profile, "host_phases": host, "pinned_peak": tk.pinned_peak, "params": params,
            "trainable": trainable, "seconds": round(time.time() - started, 1)}


def main(argv: list[str]) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    jobs_file, outdir = Path(argv[0]), Path(argv[1])
    jobs = pickle.loads(jobs_file.read_bytes())
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    # the recipes' init_process_group("cuda:nccl,cpu:gloo"): gloo is the CPU half
    dist.init_process_group("gloo")
    for i, job in enumerate(jobs):
        name = f"job{i}.rank{rank}"
        try:
            result = run_job(job["scenario"], job["steps"], rank)
            (outdir / f"{name}.json").write_text(json.dumps(result))
        except Exception as e:  # noqa: BLE001 - reported to the launcher, which stops the batch
            (outdir / f"{name}.error.json").write_text(json.dumps({"error": f"{type(e).__name__}: {e}",
                                                                   "traceback": traceback.format_exc()}))
            raise
        finally:
            dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
