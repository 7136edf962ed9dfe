"""LitGPT's own training step, on fake tensors, under memfit's Accountant (runs in LitGPT's venv).

    .venvs/litgpt/bin/python -m memfit.trace.litgpt '{"config": "Llama-3.2-1B", "method": "lora", "seq_len": 512}'

What one iteration of litgpt 0.5.x `finetune/{full,lora,adapter,adapter_v2}.py` does on one device, driven through
Lightning Fabric itself (bf16-true: the model is built under a bf16 default dtype and cast to bf16; the forward runs
under that default dtype; Fabric casts the output back to the fp32 default dtype):
  - the model is LitGPT's GPT from litgpt.{model,lora,adapter,adapter_v2}, built from a litgpt Config by name
    (optionally fewer layers), with only the method's parameters trainable (mark_only_*_as_trainable);
  - `model.max_seq_length` is set to the run's length after setup, as `fit` does (this rebuilds the RoPE cache),
    and fit's sanity-check validation (two no-grad forwards) runs before training;
  - forward with lm_head_chunk_size=128 for the adapter methods (a list of logits chunks), without for full;
    the last chunk loses its last position; `chunked_cross_entropy`; `fabric.backward`; AdamW's step (torch
    defaults, foreach as on CUDA); `zero_grad()`. No gradient clipping (the scripts refuse max_norm).
  - the loop variable `logits` lives until the next forward returns, so the previous step's logits are alive
    during the next forward (the loop here keeps it the same way).
devices > 1: each Block is wrapped in torch's non-reentrant checkpoint_wrapper, as Fabric's FSDPStrategy
(activation_checkpointing_policy={Block}) and LoRA's parallelize_fn do; sharding is not traced here.
Prints one JSON object per run: per-phase peak breakdowns of the last step and the marks.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch

from memfit.breakdown import CATEGORIES
from memfit.trace.accountant import Accountant
from memfit.trace.cuda import CudaTarget, emulate_cuda

METHODS = ("full", "lora", "adapter", "adapter_v2")
LitPrecision = Literal["bf16-true", "bf16-mixed"]  # the Fabric precisions LitGPT's finetune scripts run
HEAD_CHUNK = 128  # finetune/{lora,adapter,adapter_v2}.py: model(input_ids, lm_head_chunk_size=128)


@dataclass
class LitRun:
    config: str  # a litgpt Config name (litgpt/config.py), e.g. "Llama-3-8B"
    method: str = "lora"
    micro_batch: int = 1
    seq_len: int = 512
    n_layer: int | None = None  # fewer layers than the named config (per-layer measurements, quick tests)
    devices: int = 1  # > 1: Blocks are activation-checkpointed as the multi-device strategies do
    lora: dict = field(default_factory=dict)  # finetune/lora.py setup() arguments (lora_r, lora_mlp, ...)
    steps: int = 2
    precision: LitPrecision = "bf16-true"  # or "bf16-mixed" (LitGPT's own default): fp32 model, forward under autocast

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r}: one of {METHODS}")


# finetune/lora.py setup() defaults
LORA_DEFAULTS = {"lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "lora_query": True, "lora_key": False,
                 "lora_value": True, "lora_projection": False, "lora_mlp": False, "lora_head": False}


def litgpt_version() -> str:
    from importlib.metadata import version

    return version("litgpt")


def _modules(method: str):
    """(Config class, GPT class, Block class, mark-trainable function) of the method's litgpt module."""
    import litgpt.model as base

    if method == "full":
        return base.Config, base.GPT, base.Block, lambda model: None
    if method == "lora":
        import litgpt.lora as m

        return m.Config, m.GPT, m.Block, m.mark_only_lora_as_trainable
    if method == "adapter":
        import litgpt.adapter as m

        return m.Config, m.GPT, m.Block, m.mark_only_adapter_as_trainable
    import litgpt.adapter_v2 as m

    return m.Config, m.GPT, m.Block, m.mark_only_adapter_v2_as_trainable


def make_config(run: LitRun):
    config_cls, *_ = _modules(run.method)
    kwargs = dict(LORA_DEFAULTS | run.lora) if run.method == "lora" else {}
    if run.n_layer is not None:
        kwargs["n_layer"] = run.n_layer
    return config_cls.from_name(run.config, **kwargs)


def _fabric(precision: LitPrecision):
    import lightning as L

    return L.Fabric(accelerator="cpu", devices=1, precision=precision)


def _checkpoint_blocks(model, block_cls) -> None:
    """Each Block in torch's non-reentrant checkpoint wrapper (what FSDPStrategy's activation_checkpointing_policy
    applies, and parallelize_fn's checkpoint_wrapper(block, preserve_rng_state=False))."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model.transformer.h = torch.nn.ModuleList(
        [checkpoint_wrapper(b, preserve_rng_state=False) if isinstance(b, block_cls) else b for b in model.transformer.h])


def build(run: LitRun, fake_mode):
    """Fabric, the set-up model and optimizer, the raw GPT (for hooks).

    Built as `fabric.init_module()` does (bf16 default dtype) but on the meta device, then given fake storage:
    a module of fake parameters cannot go through `Module.to` (torch swaps fake parameters, and their weakrefs
    forbid it), so Fabric's convert_module (`module.to(bf16)`) is applied by hand: the parameters are already
    bf16, the floating buffers (the RoPE cache) are cast."""
    _, gpt_cls, block_cls, mark_trainable = _modules(run.method)
    config = make_config(run)
    fabric = _fabric(run.precision)
    # the meta device inside: Fabric's init context enters its root device (the CPU), which would win if outside
    with fabric.init_module(empty_init=False), torch.device("meta"):
        gpt = gpt_cls(config)
    mark_trainable(gpt)
    if run.devices > 1:
        _checkpoint_blocks(gpt, block_cls)
    precision = fabric.strategy.precision
    # bf16-true builds in bf16; bf16-mixed builds in fp32 and only the forward runs under autocast
    dtype = torch.float32 if "mixed" in run.precision else precision._desired_input_dtype
    with fake_mode:
        gpt.to_empty(device="cpu")
        for module in gpt.modules():
            for name, b in module.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(module, name, b.to(dtype))
    odd = [n for n, p in gpt.named_parameters() if p.dtype != dtype]
    if odd:
        raise RuntimeError(f"parameters not in {dtype} after init_module: {odd[:3]}")
    precision.convert_module = lambda module: module  # done above
    with fake_mode:
        model = fabric.setup_module(gpt, move_to_device=False)
        # instantiate_torch_optimizer("AdamW", model.parameters()): torch defaults; CUDA params pick foreach
        optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), foreach=True))
        model.max_seq_length = run.seq_len  # fit(): min(longest sequence, train.max_seq_length)
    return fabric, model, optimizer, gpt


def _label_state(acc: Accountant, gpt, optimizer) -> None:
    for p in gpt.parameters():
        acc.register(p, "weights")
        if p.grad is not None:
            acc.register(p.grad, "gradients")
    for b in gpt.buffers():
        acc.register(b, "weights")
    for state in optimizer.optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                acc.register(value, "optimizer_states")
                if key == "step":
                    acc.exclude(value)  # a host scalar for foreach AdamW on CUDA


def _hooks(acc: Accountant, gpt) -> list:
    """Gradients labelled when stored; lm_head and the loss are the logits_loss region, until the gradient
    reaches lm_head's input in backward."""
    handles = [p.register_post_accumulate_grad_hook(lambda q: acc.label(q.grad, "gradients"))
               for p in gpt.parameters() if p.requires_grad]

    def enter_logits(module, args):
        acc.region = "logits_loss"
        hidden = args[0]
        if hidden.requires_grad and not getattr(hidden, "_memfit_hooked", False):
            hidden.register_hook(lambda grad: setattr(acc, "region", "activations"))
            hidden._memfit_hooked = True

    handles.append(gpt.lm_head.register_forward_pre_hook(enter_logits))
    return handles


def _forward(run: LitRun, model, input_ids):
    """finetune/*.py fit(): `logits = model(...)` (the previous iteration's logits die when this returns)."""
    if run.method == "full":
        return model(input_ids)
    logits = model(input_ids, lm_head_chunk_size=HEAD_CHUNK)
    logits[-1] = logits[-1][..., :-1, :]  # shift: output n predicts token n+1
    return logits


def _loss(run: LitRun, logits, targets):
    from litgpt.utils import chunked_cross_entropy

    if run.method == "full":
        return chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
    return chunked_cross_entropy(logits, targets[..., 1:])


def _sanity_check(run: LitRun, model, vocab: int) -> None:
    """fit() validates two batches before training (`validate(..., max_iters=2)`: eval mode, no_grad, the full
    logits, unchunked loss). It matters beyond its own memory: adapter.py caches the prefix's k/v on its first
    call, so training reuses that no-grad copy."""
    from litgpt.utils import chunked_cross_entropy

    model.eval()
    with torch.no_grad():
        for _ in range(2):
            input_ids = torch.randint(0, vocab, (run.micro_batch, run.seq_len))
            logits = model(input_ids)
            chunked_cross_entropy(logits[..., :-1, :], input_ids[..., 1:], chunk_size=0)
            del logits
    model.train()


def trace(run: LitRun, target: CudaTarget | None = None) -> dict:
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    fabric, model, optimizer, gpt = build(run, fake_mode)
    acc = Accountant()
    handles = _hooks(acc, gpt)
    vocab = gpt.config.padded_vocab_size
    logits = None  # the loop variable: alive until the next forward returns
    try:
        with fake_mode, acc, emulate_cuda(target or CudaTarget(), acc):
            _sanity_check(run, model, vocab)
            for step in range(run.steps):
                _label_state(acc, gpt, optimizer)
                acc.enter_phase("forward", step)
                input_ids = torch.randint(0, vocab, (run.micro_batch, run.seq_len))
                targets = input_ids.clone()
                logits = _forward(run, model, input_ids)
                loss = _loss(run, logits, targets)
                acc.region = "activations"
                acc.mark(f"forward_end@{step}")
                acc.enter_phase("backward")
                acc.region = "logits_loss"
                fabric.backward(loss)
                acc.mark(f"backward_end@{step}")
                acc.enter_phase("optimizer_step")
                optimizer.step()
                optimizer.zero_grad()
                del loss, input_ids, targets
                acc.mark(f"step_end@{step}")
            _label_state(acc, gpt, optimizer)
    finally:
        for h in handles:
            h.remove()
    return _result(run, acc, gpt)


def _result(run: LitRun, acc: Accountant, gpt) -> dict:
    last = run.steps - 1
    phases = {name: dict(b.parts) for name, b in acc.profile(last).phases.items()}
    marks = {k.split("@")[0]: dict(b.parts) for k, b in acc.marks.items() if k.endswith(f"@{last}")}
    trainable = sum(p.numel() for p in gpt.parameters() if p.requires_grad)
    at = CATEGORIES.index("logits_loss")
    logits_max: dict[str, int] = {}  # the largest logits_loss of each phase, whenever in the phase it comes
    for point in acc.timeline:
        if point.step == last:
            logits_max[point.phase] = max(logits_max.get(point.phase, 0), point.parts[at])
    return {"run": asdict(run), "litgpt": litgpt_version(), "torch": torch.__version__.split("+")[0],
            "phases": phases, "marks": marks, "logits_max": logits_max, "peak": max(sum(p.values()) for p in phases.values()),
            "params": sum(p.numel() for p in gpt.parameters()), "trainable": trainable,
            "vocab": gpt.config.padded_vocab_size, "n_layer": gpt.config.n_layer}


def main(argv: list[str]) -> int:
    """Each argument (or each line on stdin when there is none) is one run as JSON; one JSON result per line."""
    import warnings

    warnings.filterwarnings("ignore")
    specs = argv or [line for line in sys.stdin if line.strip()]
    for spec in specs:
        try:
            run = LitRun(**json.loads(spec))
            make_config(run)  # an unknown config name fails here, before any tracing
        except (ValueError, TypeError) as e:  # malformed JSON, unknown keys, methods or config names
            print(f"memfit: error: run {spec.strip()!r}: {e}", file=sys.stderr)
            return 2
        print(json.dumps(trace(run)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
