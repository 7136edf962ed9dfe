"""The measuring half of bench/cuda_truth.py: one configuration's real training steps, as HF Trainer runs them.

`measure_row(scenario, ...)` builds the model of a memfit Scenario with random weights on the device (memfit's own
builder, memfit/trace/build.py, for everything but the 4-bit base; QLoRA through transformers' own bitsandbytes
quantizer and PEFT's prepare_model_for_kbit_training), then runs the calls HF Trainer's training_step makes
(transformers 5.24 trainer.py, accelerate 1.15 Accelerator.prepare_model for bf16):

    with torch.autocast(device, bf16): outputs = model(**batch)     # accelerate's autocast around forward
    outputs = convert_to_fp32(outputs)                              # ... and its ConvertOutputsToFp32 wrapper
    loss = outputs["loss"]; del outputs                             # compute_loss returns the loss alone
    loss.backward()
    clip_grad_norm_(params, 1.0); optimizer.step(); model.zero_grad(set_to_none=True)

Peak statistics are reset at each phase (forward, backward, optimizer step), so each phase's own peak is read.
On the CPU every CUDA reading is None: the same code runs, nothing is invented.
"""
from __future__ import annotations

import gc
import os
import statistics
import time
import warnings
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import torch

from memfit.facts.scenario import Scenario
from memfit.facts.versions import installed
from memfit.trace import build as tb
from memfit.trace.run import MAX_GRAD_NORM, make_batch, make_optimizer, padding_plan

STEP_PHASES = ("forward", "backward", "optimizer_step")
TRACE_ENTRIES = 1_000_000  # allocation events the trace of a flagged row keeps (far more than one step makes)
EXTRA_PACKAGES = ("bitsandbytes", "liger-kernel", "triton", "nvidia-ml-py")  # beside memfit's pinned ones


class Unavailable(Exception):
    """The configuration needs something this machine lacks (a package, a kernel); the row says what."""


# ---------------------------------------------------------------------------------------------- readings
class Nvml:
    """NVML's device-used (the nvidia-smi number) and this process's used memory; None where NVML is missing."""

    def __init__(self, index: int = 0):
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # noqa: BLE001 - no NVML (CPU, or a driver without it): the row says None
            self._nvml = self._handle = None

    def used(self) -> int | None:
        return None if self._nvml is None else int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def process_used(self) -> int | None:
        if self._nvml is None:
            return None
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except Exception:  # noqa: BLE001 - not supported in some VMs
            return None
        mine = [p for p in procs if p.pid == os.getpid()] or (procs if len(procs) == 1 else [])
        return int(mine[0].usedGpuMemory) if mine and mine[0].usedGpuMemory is not None else None

    def driver(self) -> str | None:
        if self._nvml is None:
            return None
        value = self._nvml.nvmlSystemGetDriverVersion()
        return value.decode() if isinstance(value, bytes) else value


class Probe:
    """Per-phase peaks: reset at the phase's start, read at its end (after a synchronize). CPU: all None.
    The warm-up step's readings go to `warmup`, the steady steps' to `phases`."""

    def __init__(self, device: torch.device, nvml: Nvml):
        self.cuda = device.type == "cuda"
        self.device, self.nvml = device, nvml
        self.phases: dict[str, dict] = {}
        self.warmup: dict[str, dict] = {}
        self.into = self.phases
        self.current: str | None = None  # the phase running now (an OOM names it)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def begin(self, phase: str) -> None:
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.current = phase

    def end(self) -> None:
        self.sync()
        row = self.into.setdefault(self.current, dict.fromkeys(("max_allocated", "max_reserved", "device_used",
                                                                "nvml_used"), None))
        self.current = None
        if not self.cuda:
            return
        free, total = torch.cuda.mem_get_info(self.device)
        readings = {"max_allocated": torch.cuda.max_memory_allocated(self.device),
                    "max_reserved": torch.cuda.max_memory_reserved(self.device),
                    "device_used": total - free, "nvml_used": self.nvml.used()}
        for key, value in readings.items():
            if value is not None:
                row[key] = max(row[key] or 0, value)

    def now(self) -> dict:
        if not self.cuda:
            return {"allocated": None, "reserved": None}
        return {"allocated": torch.cuda.memory_allocated(self.device),
                "reserved": torch.cuda.memory_reserved(self.device)}

    def at_oom(self) -> dict:
        """Where an OOM struck, and the peak of that phase up to the failed allocation."""
        return {"oom_phase": self.current or "load", "oom_in_warmup": self.into is self.warmup,
                "oom_phase_peak_allocated": torch.cuda.max_memory_allocated(self.device) if self.cuda else None}


def versions() -> dict:
    out = dict(installed())
    for name in EXTRA_PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    out["cuda"] = torch.version.cuda
    return out


def run_facts(device: torch.device) -> dict:
    """What every row of one run shares: versions, the device, the CUDA context and cuBLAS workspace.

    context: device used after the first CUDA call minus before it (NVML, which makes no context). cuBLAS: one bf16
    matmul's lasting cost, inside the caching allocator (its workspace) and outside it (handle, loaded kernels)."""
    nvml = Nvml(device.index or 0)
    facts = {"versions": versions(), "device": str(device), "device_name": None, "driver": nvml.driver(),
             "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"),
             "device_used_before_torch": None, "device_used_after_init": None, "context_bytes": None,
             "cublas_workspace_bytes": None, "cublas_outside_allocator_bytes": None, "device_total_bytes": None}
    if device.type != "cuda":
        return facts
    before = nvml.used()
    free, total = torch.cuda.mem_get_info(device)  # creates the context
    after = nvml.used()  # NVML on both sides: mem_get_info's total leaves out what the driver reserves
    facts |= {"device_name": torch.cuda.get_device_name(device), "device_total_bytes": total,
              "device_used_before_torch": before, "device_used_after_init": total - free,
              "context_bytes": None if before is None else after - before}
    a = torch.randn(1024, 1024, dtype=torch.bfloat16, device=device)
    used_a, allocated_a = total - torch.cuda.mem_get_info(device)[0], torch.cuda.memory_allocated(device)
    reserved_a = torch.cuda.memory_reserved(device)
    b = a @ a
    torch.cuda.synchronize(device)
    del b
    facts["cublas_workspace_bytes"] = torch.cuda.memory_allocated(device) - allocated_a
    outside = (total - torch.cuda.mem_get_info(device)[0] - used_a) - (torch.cuda.memory_reserved(device) - reserved_a)
    facts["cublas_outside_allocator_bytes"] = outside
    del a
    torch.cuda.empty_cache()
    return facts


# ---------------------------------------------------------------------------------------------- building
def check_runnable(s: Scenario, device: torch.device) -> None:
    """What this bench cannot run, said before anything is built."""
    if s.loss == "liger" and device.type != "cuda":
        raise Unavailable("Liger's kernels are Triton kernels and need a CUDA device")
    if s.loss not in ("standard", "liger"):
        raise Unavailable(f"loss {s.loss!r}: this bench runs HF Trainer's loss or Liger's")
    if s.checkpointing not in ("off", "full", "every_n"):
        raise Unavailable(f"checkpointing {s.checkpointing!r} is not a Trainer switch; this bench runs off, full and "
                          "every_n")
    if s.tuning == "qlora" and s.quant_bits != 4:
        raise Unavailable("this bench runs 4-bit (NF4) QLoRA only")
    if s.engine != "single" or s.hardware.world_size != 1:
        raise Unavailable("this bench runs one process on one GPU")


def enable_checkpointing(hf_model, s: Scenario) -> None:
    """Trainer's call for `activation_checkpointing` / `gradient_checkpointing` with use_reentrant as the scenario
    says: transformers >= 5.2x names it activation_checkpointing_enable, 5.17 gradient_checkpointing_enable (both
    default use_reentrant False)."""
    if s.checkpointing == "off":
        return
    kwargs = {"use_reentrant": s.reentrant}
    every = s.checkpoint_every_n if s.checkpointing == "every_n" else 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if hasattr(hf_model, "activation_checkpointing_enable"):
            hf_model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, every_n_layers=every)
        else:
            hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs, every_n_layers=every)


def checkpointed_layers(hf_model) -> int:
    """Decoder layers that will recompute in backward (transformers' GradientCheckpointingLayer switch)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return sum(m.gradient_checkpointing for m in hf_model.modules() if isinstance(m, GradientCheckpointingLayer))


def _build_attention(s: Scenario, device: torch.device) -> tuple[Scenario, str]:
    """(scenario to build, the attention kernel in words). `flash` without flash_attn is SDPA's flash backend (its
    own FlashAttention-2), forced for the whole step; memfit's CPU stand-in never runs here."""
    if s.attention != "flash":
        return s, f"{s.attention} (torch picks the SDPA backend)" if s.attention == "sdpa" else s.attention
    from transformers.utils import is_flash_attn_2_available

    if device.type == "cuda" and is_flash_attn_2_available():
        return s, "flash_attention_2 (flash_attn)"
    return s.with_changes(attention="sdpa"), "sdpa, flash backend only (flash_attn not installed)"


def quantize_4bit(hf_model, s: Scenario, device: torch.device) -> int:
    """transformers' own bitsandbytes path of from_pretrained(quantization_config=BitsAndBytesConfig(nf4)): its
    quantizer swaps the Linears (lm_head kept), each weight becomes Params4bit as its Bnb4bitQuantize op makes it,
    then postprocess_model marks the model loaded in 4 bit. Weights come from the random model, not a file."""
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise Unavailable("bitsandbytes is not installed (pip install bitsandbytes==0.50.2); the row ran up to the "
                          "quantization call") from None
    from transformers import BitsAndBytesConfig
    from transformers.quantizers import AutoHfQuantizer

    compute = tb.compute_dtype(s)
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=s.double_quant,
                                bnb_4bit_compute_dtype=compute)
    quantizer = AutoHfQuantizer.from_config(config, pre_quantized=False)
    linears = {name: m for name, m in hf_model.named_modules() if type(m) is torch.nn.Linear}
    quantizer.preprocess_model(model=hf_model, dtype=compute, device_map={"": device}, checkpoint_files=None,
                               use_kernels=False)
    count = 0
    for name, module in hf_model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit) and module.weight.device.type == "meta":
            source = linears[name]
            packed = bnb.nn.Params4bit(source.weight.data, requires_grad=False, **module.weight.__dict__)
            module.weight = packed.to(device)  # .to quantizes (bitsandbytes Params4bit._quantize)
            if source.bias is not None:
                module.bias = torch.nn.Parameter(source.bias.data, requires_grad=False)
            count += 1
    del linears
    hf_model.hf_quantizer = quantizer
    quantizer.postprocess_model(hf_model)
    return count


@dataclass
class Built:
    model: torch.nn.Module  # what the step calls (PeftModel or the transformers model)
    hf_model: torch.nn.Module
    autocast: torch.dtype | None
    kernel: str  # the attention kernel, in words
    notes: list[str]
    quantized: int = 0  # Linear layers in 4 bit


def build(s: Scenario, device: torch.device) -> Built:
    built_s, kernel = _build_attention(s, device)
    if s.tuning != "qlora":
        built = tb.build_model(built_s.with_changes(checkpointing="off"), device=device)
        enable_checkpointing(built.hf_model, s)
        return Built(built.model, built.hf_model, built.autocast_dtype, kernel, built.notes)
    # QLoRA as PEFT / TRL run it: load quantized (the 16-bit model, then the quantizer), upcast, PEFT LoRA
    from peft import prepare_model_for_kbit_training

    from memfit.trace.peft import apply_lora

    base = tb.build_model(built_s.with_changes(tuning="full", checkpointing="off"), device=device)
    frozen = tb.dtypes_for(s)[0]
    for p in base.hf_model.parameters():  # from_pretrained(dtype=compute): every weight 16-bit, none trainable yet
        p.data, p.requires_grad = p.data.to(frozen), False
    quantized = quantize_4bit(base.hf_model, s, device)
    notes = base.notes + [f"bitsandbytes {version('bitsandbytes')}: {quantized} Linear layers to NF4 by transformers' "
                          f"quantizer"]
    if s.kbit_upcast:
        prepare_model_for_kbit_training(base.hf_model, use_gradient_checkpointing=False)
        notes.append("prepare_model_for_kbit_training: non-quantized parameters upcast to fp32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = apply_lora(base.hf_model, s, base.family)
    model.train()
    if s.adapter_dtype != "fp32":  # PEFT keeps adapters in fp32 (autocast_adapter_dtype); a framework may cast them
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.data = p.data.to(tb.DTYPES[s.adapter_dtype])
    enable_checkpointing(base.hf_model, s)
    return Built(model, base.hf_model, base.autocast_dtype, kernel, notes, quantized)


def apply_liger(model, s: Scenario, device: torch.device) -> str | None:
    """HF Trainer's use_liger_kernel=True: transformers.integrations.liger.apply_liger_kernel with no config
    (Liger's defaults for the family: RoPE, RMSNorm, SwiGLU, fused linear cross entropy)."""
    if s.loss != "liger":
        return None
    try:
        from transformers.integrations.liger import apply_liger_kernel

        apply_liger_kernel(model, None)
    except ImportError as e:
        raise Unavailable(f"liger-kernel does not import ({e}); pip install liger-kernel==0.8.5") from None
    return f"liger-kernel {version('liger-kernel')}: HF Trainer's apply_liger_kernel defaults"


# ---------------------------------------------------------------------------------------------- the step
@contextmanager
def attention_backend(kernel_note: str):
    """The whole step under SDPA's flash backend alone when `flash` runs on SDPA."""
    if "flash backend only" not in kernel_note:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        yield


def train_step(model, trainable, optimizer, batch: dict, autocast, device: torch.device, probe: Probe) -> tuple:
    """One HF Trainer step in three measured phases; (loss value, seconds per phase, trainable tensors that got a
    gradient: all of them, or the step trained less than it claims)."""
    from accelerate.utils import convert_to_fp32

    seconds = {}
    probe.begin("forward")
    t = time.perf_counter()
    with torch.autocast(device.type, dtype=autocast) if autocast is not None else nullcontext():
        outputs = model(**batch)
    batch.clear()  # training_step's `del inputs` before backward
    if autocast is not None:
        outputs = convert_to_fp32(outputs)  # accelerate's ConvertOutputsToFp32 around the autocast forward
    loss = outputs["loss"]
    del outputs
    probe.end()
    seconds["forward"] = time.perf_counter() - t
    probe.begin("backward")
    t = time.perf_counter()
    loss.backward()
    probe.end()
    seconds["backward"] = time.perf_counter() - t
    with_grad = sum(p.grad is not None for p in trainable)
    probe.begin("optimizer_step")
    t = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(trainable, MAX_GRAD_NORM)
    optimizer.step()
    model.zero_grad(set_to_none=True)
    probe.end()
    seconds["optimizer_step"] = time.perf_counter() - t
    return float(loss.detach()), seconds, with_grad


def device_batch(s: Scenario, device: torch.device) -> tuple[dict, int]:
    """memfit's own batch for the scenario (memfit/trace/run.py make_batch: one padding position in a padded
    batch, so a mask is there as a collator would make it), moved as Trainer's _prepare_inputs does; real tokens."""
    batch = make_batch(s, pad_tokens=1, fake=False)
    rows, length, pads = padding_plan(s, 1)
    return {k: v.to(device) for k, v in batch.kwargs.items()}, rows * length - pads


# ---------------------------------------------------------------------------------------------- one row
def measure_row(s: Scenario, device: torch.device, steps: int, history: bool, nvml: Nvml) -> dict:
    """Everything one configuration measures. Raises Unavailable, or torch.OutOfMemoryError with `.partial` set to
    what was measured before it (the caller drops the exception, and with it every tensor of the row)."""
    check_runnable(s, device)
    probe = Probe(device, nvml)
    row: dict = {}
    try:
        with ExitStack() as stack:
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
            _quiet_transformers(stack)
            built = build(s, device)
            model = built.model
            liger = apply_liger(model, s, device)
            row |= {"attention_kernel": built.kernel, "notes": built.notes + ([liger] if liger else [])}
            trainable = [p for p in model.parameters() if p.requires_grad]
            row |= {"params_total": sum(p.numel() for p in model.parameters()),
                    "params_trainable": sum(p.numel() for p in trainable),
                    "checkpointed_layers": checkpointed_layers(built.hf_model), "quantized_linears": built.quantized}
            optimizer = make_optimizer(s, trainable)
            probe.sync()
            row["after_build"] = probe.now()
            stack.enter_context(attention_backend(built.kernel))
            row |= _steps(s, model, trainable, optimizer, built.autocast, device, probe, steps)
            row["history"] = (_history_step(s, model, trainable, optimizer, built.autocast, device, probe)
                              if history and probe.cuda else None)
    except torch.OutOfMemoryError as e:
        e.partial = row | _phase_summary(probe) | probe.at_oom()
        raise
    return row | _phase_summary(probe)


def _quiet_transformers(stack: ExitStack) -> None:
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    stack.callback(hf_logging.set_verbosity, verbosity)


def _steps(s, model, trainable, optimizer, autocast, device, probe: Probe, steps: int) -> dict:
    """`steps` steps; the first is warm-up (optimizer states are made there), so peaks and times are of the rest."""
    losses, phase_times = [], []
    tokens = 0
    for i in range(steps):
        batch, tokens = device_batch(s, device)
        probe.into = probe.warmup if i == 0 else probe.phases
        loss, seconds, with_grad = train_step(model, trainable, optimizer, batch, autocast, device, probe)
        del batch
        losses.append(loss)
        if i > 0:
            phase_times.append(seconds)
    probe.into = probe.phases
    times = [sum(x.values()) for x in phase_times]
    median = statistics.median(times) if times else None
    phase_s = {p: statistics.median(x[p] for x in phase_times) for p in STEP_PHASES} if phase_times else None
    return {"losses": losses, "trainable_tensors": len(trainable), "trainable_tensors_with_grad": with_grad,
            "step_seconds": times, "median_step_s": median, "median_phase_s": phase_s,
            "tokens_per_step": tokens, "tokens_per_s": tokens / median if median else None,
            "warmup_phases": probe.warmup}


def _phase_summary(probe: Probe) -> dict:
    phases = probe.phases
    out = {"phases": phases, "peak_phase": None, "max_memory_allocated": None, "max_memory_reserved": None,
           "device_used": None, "nvml_used": None, "nvml_process_used": None, "alloc_retries": None}
    readings = {p: v for p, v in phases.items() if v.get("max_allocated") is not None}
    if not readings:
        return out
    out["peak_phase"] = max(readings, key=lambda p: readings[p]["max_allocated"])
    for key, name in (("max_allocated", "max_memory_allocated"), ("max_reserved", "max_memory_reserved"),
                      ("device_used", "device_used"), ("nvml_used", "nvml_used")):
        values = [v[key] for v in readings.values() if v[key] is not None]
        out[name] = max(values) if values else None
    out["nvml_process_used"] = probe.nvml.process_used()
    out["alloc_retries"] = torch.cuda.memory_stats(probe.device).get("num_alloc_retries")
    return out


# ---------------------------------------------------------------------------------------------- memory history
def _history_step(s, model, trainable, optimizer, autocast, device, probe) -> dict:
    """One more step with the allocation trace on: what is live at its peak, biggest first (the timed steps are
    done; this step's time is not used)."""
    labels = _tensor_labels(model, optimizer)
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=TRACE_ENTRIES)
    try:
        before = torch.cuda.memory._snapshot()
        batch, _ = device_batch(s, device)
        train_step(model, trainable, optimizer, batch, autocast, device, Probe(device, probe.nvml))
        del batch
        after = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return peak_allocations(before, after, device.index or 0, labels)


def _tensor_labels(model, optimizer) -> dict[int, tuple[str, str]]:
    """Block address -> (kind, detail) for the state live before the step: parameters and optimizer states (their
    blocks were allocated before the trace started, so they have no frames)."""
    labels = {}
    for name, p in model.named_parameters():
        dtype = str(p.dtype).removeprefix("torch.")
        labels[p.data_ptr()] = (f"parameters ({dtype})", f"parameter {name} ({dtype})")
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                dtype = str(value.dtype).removeprefix("torch.")
                labels[value.data_ptr()] = (f"optimizer {key} ({dtype})",) * 2
    return labels


def peak_allocations(before: dict, after: dict, device: int, labels: dict[int, tuple[str, str]], top: int = 12) -> dict:
    """Replay torch's allocation trace (torch.cuda.memory._snapshot format) from the blocks live in `before` through
    the events `after` recorded since: the live set at the largest total, as the `top` biggest blocks and the bytes per
    site (the innermost frames outside torch, or what the block holds). Bytes are requested sizes, as the trace
    records them (c10 CUDACachingAllocator record_trace), so the replayed peak is a little under
    max_memory_allocated."""
    untraced = ("live before the step",) * 2
    live = {b["address"]: (b.get("requested_size", b["size"]), *labels.get(b["address"], untraced))
            for seg in before["segments"] if seg.get("device", device) == device
            for b in seg["blocks"] if b["state"] in ("active_allocated", "active_awaiting_free")}
    events = after["device_traces"][device][len(before["device_traces"][device]):]
    start = sum(size for size, _, _ in live.values())
    total, peak, peak_at = start, start, -1
    for i, e in enumerate(events):
        total += e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed" else 0
        if total > peak:
            peak, peak_at = total, i
    for e in events[:peak_at + 1]:
        if e["action"] == "alloc":
            site = _site(e.get("frames") or [])
            live[e["addr"]] = (e["size"], site, site)
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    sites: dict[str, list[int]] = {}
    for size, site, _ in live.values():
        entry = sites.setdefault(site, [0, 0])
        entry[0] += size
        entry[1] += 1
    biggest = sorted(live.values(), key=lambda x: -x[0])[:top]
    return {"peak_bytes": peak, "live_at_step_start": start, "events": len(events),
            "trace_full": len(after["device_traces"][device]) >= TRACE_ENTRIES,
            "top_blocks": [{"bytes": size, "what": detail} for size, _, detail in biggest],
            "top_sites": [{"bytes": b, "blocks": n, "site": site}
                          for site, (b, n) in sorted(sites.items(), key=lambda x: -x[1][0])[:top]]}


def _site(frames: list[dict]) -> str:
    """The innermost three frames outside torch's own files (frames come innermost first)."""
    outside = [f for f in frames if "/torch/" not in f["filename"] and f["filename"] != "??"]
    if not outside:
        return "allocated in the step (torch internals only)"
    return " < ".join(f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in outside[:3])


def free_device(device: torch.device) -> dict:
    """Between rows: collect and empty the cache; what stays allocated (should be ~0: no row leaks into the next)."""
    gc.collect()
    if device.type != "cuda":
        return {"allocated": None, "reserved": None}
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return {"allocated": torch.cuda.memory_allocated(device), "reserved": torch.cuda.memory_reserved(device)}
