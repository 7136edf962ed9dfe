"""`memfit trace` for torchtune: torchtune's own model code and recipe step, on fake tensors, on the CPU.

    from memfit.trace.torchtune import run_torchtune_trace
    result = run_torchtune_trace(scenario)    # a TraceResult, as memfit.trace.run_trace returns

Needs torchtune (its own venv: tests/trace/setup_torchtune_venv.sh). The model is built by torchtune's
component builders (torchtune.models.<family>._component_builders: llama2, llama3, llama3_1, llama3_2,
qwen2 and their lora_* twins) from the catalog's numbers, under `training.set_default_dtype(bf16)` as the
recipes build it; LoRA runs `set_trainable_params(model, get_adapter_params(model))`; checkpointing is
`training.set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})`.

One step is the single-device recipes' (full_finetune_single_device.py, lora_finetune_single_device.py):
the batch's tokens and labels, the forward, the labels shifted with an ignore column, the loss
(CEWithChunkedOutputLoss after `model.set_num_output_chunks`, or CrossEntropyLoss on fp32 logits) times
the token count, backward, `training.scale_grads`, optimizer step and `zero_grad(set_to_none=True)`; with
optimizer_in_backward, one optimizer per parameter stepped by `training.register_optim_in_bwd_hooks`.
The batch carries no mask: torchtune's padded collate pads tokens and labels only, and the model attends
causally (packed batches run flex attention on CUDA, which this trace does not emulate).
"""
from __future__ import annotations

import importlib
import time
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from memfit.errors import MemfitError
from memfit.facts.frameworks import torchtune_builder
from memfit.facts.scenario import Scenario
from memfit.trace.accountant import Accountant
from memfit.trace.cuda import CudaTarget
from memfit.trace.run import Batch, TraceResult, _extras, make_optimizer
from memfit.trace.training_step import label_model_state, traced_step

if TYPE_CHECKING:
    from torchtune.modules import TransformerDecoder  # what every torchtune model builder returns

IGNORE_INDEX = -100  # CEWithChunkedOutputLoss / CrossEntropyLoss ignore_index in the recipes
ATTN_NAMES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "output_proj"}
MLP_NAMES = ("gate_proj", "up_proj", "down_proj")  # torchtune's w1, w3, w2: apply_lora_to_mlp takes all three


def torchtune_version() -> str:
    from importlib.metadata import version

    return version("torchtune")


# ---------------------------------------------------------------------------------------------- the model
def builder_name(spec) -> str:
    """The torchtune component builder of a catalog model (the one its model builders call)."""
    if spec.arch not in ("llama", "qwen2"):
        raise MemfitError(f"the torchtune trace builds llama and qwen2 models, not {spec.arch}")
    return torchtune_builder(spec)


def _model_kwargs(spec, builder: str) -> dict:
    if spec.head_dim * spec.num_heads != spec.hidden_size:
        raise MemfitError(f"torchtune's builders take head_dim = hidden / heads; {spec.id} has another")
    kw = dict(vocab_size=spec.vocab_size, num_layers=spec.num_layers, num_heads=spec.num_heads,
              num_kv_heads=spec.num_kv_heads, embed_dim=spec.hidden_size, intermediate_dim=spec.intermediate_size,
              max_seq_len=spec.max_position_embeddings or 4096)
    if builder == "qwen2":
        kw["tie_word_embeddings"] = spec.tie_embeddings
    return kw


def lora_kwargs(s: Scenario) -> dict:
    """lora_attn_modules / apply_lora_to_mlp / apply_lora_to_output of the scenario's targets."""
    names = [t.split(".")[-1] for t in (s.lora_targets or ())]
    if not names or "all-linear" in names:
        names = [*ATTN_NAMES, *MLP_NAMES]
    mlp = [n for n in names if n in MLP_NAMES]
    if mlp and len(mlp) != len(MLP_NAMES):
        raise MemfitError("torchtune adapts all of the MLP (apply_lora_to_mlp) or none of it: "
                          f"targets {','.join(mlp)} are a part")
    unknown = [n for n in names if n not in ATTN_NAMES and n not in MLP_NAMES and n != "lm_head"]
    if unknown:
        raise MemfitError(f"torchtune has no LoRA target {unknown[0]!r}")
    return dict(lora_attn_modules=[ATTN_NAMES[n] for n in names if n in ATTN_NAMES], apply_lora_to_mlp=bool(mlp),
                apply_lora_to_output="lm_head" in names, lora_rank=s.lora_rank, lora_alpha=2 * s.lora_rank,
                lora_dropout=s.lora_dropout)


def build_torchtune_model(s: Scenario, fake_mode) -> TransformerDecoder:
    """torchtune's model of the scenario, in bf16, trainable as the recipe sets it, checkpointed as configured."""
    from torchtune import modules, training
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    name = builder_name(s.model)
    builders = importlib.import_module(f"torchtune.models.{name}._component_builders")
    kwargs = _model_kwargs(s.model, name)
    lora = s.tuning == "lora"
    if lora:
        kwargs |= lora_kwargs(s)
    with ExitStack() as stack:
        if fake_mode is not None:
            stack.enter_context(fake_mode)
            stack.enter_context(_real_rope_caches())
        stack.enter_context(training.set_default_dtype(torch.bfloat16))
        model = getattr(builders, f"lora_{name}" if lora else name)(**kwargs)
    if fake_mode is not None:
        _fake_buffers(model, fake_mode)
    if lora:
        set_trainable_params(model, get_adapter_params(model))
    if s.checkpointing == "full":
        training.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
    return model


ROPE_CLASSES = (("torchtune.modules", "RotaryPositionalEmbeddings"),
                ("torchtune.models.llama3_1._position_embeddings", "Llama3ScaledRoPE"),
                ("torchtune.models.qwen2._positional_embeddings", "Qwen2RotaryPositionalEmbeddings"))


@contextmanager
def _real_rope_caches():
    """RoPE caches built with real numbers: Llama 3.1's frequency scaling branches on their values, which fake
    tensors do not have. The cache (max_seq_len x head_dim fp32) is a buffer of the model like any other."""
    from torch.utils._python_dispatch import _disable_current_modes

    originals = []
    for module, name in ROPE_CLASSES:
        cls = getattr(importlib.import_module(module), name, None)
        if cls is None:
            continue
        originals.append((cls, cls.rope_init))

        def real_init(self, _init=cls.rope_init):
            with _disable_current_modes():
                _init(self)

        cls.rope_init = real_init
    try:
        yield
    finally:
        for cls, init in originals:
            cls.rope_init = init


def _fake_buffers(model: torch.nn.Module, fake_mode) -> None:
    """Real buffers (the RoPE caches) become fake twins of the same size, shared where the module is shared."""
    from torch._subclasses.fake_tensor import FakeTensor

    for module in model.modules():
        for key, buf in module._buffers.items():
            if buf is not None and not isinstance(buf, FakeTensor):
                module._buffers[key] = fake_mode.from_tensor(buf)


def check_supported(s: Scenario) -> None:
    why = None
    if s.engine != "single":
        why = f"engine {s.engine} (the trace runs the single-device recipes)"
    elif s.tuning not in ("full", "lora"):
        why = f"tuning {s.tuning}"
    elif s.precision != "bf16-pure":
        why = f"precision {s.precision} (the recipes run dtype bf16 without fp32 masters)"
    elif s.loss not in ("chunked_output", "standard"):
        why = f"loss {s.loss}"
    elif s.checkpointing not in ("off", "full"):
        why = f"checkpointing {s.checkpointing} (activation offloading needs CUDA streams)"
    elif s.attention != "sdpa":
        why = f"attention {s.attention} (torchtune's attention calls torch SDPA)"
    elif s.padding == "packed":
        why = "packed batches (torchtune runs flex attention on them on CUDA)"
    elif s.optimizer not in ("adamw-foreach", "adamw-fused", "adamw-loop", "sgd"):
        why = f"optimizer {s.optimizer} (bitsandbytes kernels need a GPU)"
    elif s.optimizer_in_backward and s.grad_accum > 1:
        why = "optimizer_in_bwd with gradient accumulation (the recipes refuse it)"
    if why:
        raise MemfitError(f"the torchtune trace cannot run {why}")


# ---------------------------------------------------------------------------------------------- the recipe
class _Recipe:
    """What a single-device recipe holds between steps: the model, the loss, the optimizer(s)."""

    def __init__(self, s: Scenario, model: TransformerDecoder, acc: Accountant):
        from torchtune.modules.loss import CEWithChunkedOutputLoss

        self.s, self.model, self.acc = s, model, acc
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        if s.loss == "chunked_output":
            self.loss_fn = CEWithChunkedOutputLoss(ignore_index=IGNORE_INDEX)
            model.set_num_output_chunks(self.loss_fn.num_output_chunks)
        else:
            self.loss_fn = torch.nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX)
        self.optimizers = self._optimizers()
        self.ignore_labels_cache = torch.full((s.micro_batch, 1), IGNORE_INDEX)
        self.handles = self._hooks()

    def _optimizers(self) -> list:
        if not self.s.optimizer_in_backward:
            return [make_optimizer(self.s, self.trainable)]
        from torchtune import training

        acc = self.acc
        saved = []

        def before(p):  # the gradient is complete; the step that follows is optimizer work
            acc.label(p.grad, "gradients")
            saved.append(acc.region)
            acc.region = "optimizer_states"

        for p in self.trainable:
            p.register_post_accumulate_grad_hook(before)
        optim_dict = {p: make_optimizer(self.s, [p]) for p in self.trainable}
        training.register_optim_in_bwd_hooks(model=self.model, optim_dict=optim_dict)
        for p in self.trainable:
            p.register_post_accumulate_grad_hook(lambda p: setattr(acc, "region", saved.pop()))
        return list(optim_dict.values())

    def _hooks(self) -> list:
        """Gradients are labelled when autograd stores them; the output projection + loss is logits_loss."""
        from torchtune.modules import TiedLinear

        acc = self.acc
        handles = [p.register_post_accumulate_grad_hook(lambda p: acc.label(p.grad, "gradients"))
                   for p in self.trainable if not self.s.optimizer_in_backward]
        head = self.model.output.linear if isinstance(self.model.output, TiedLinear) else self.model.output
        handles.append(head.register_forward_pre_hook(lambda *_: setattr(acc, "region", "logits_loss")))

        def after_norm(module, args, out):  # its gradient arriving ends the loss part of backward
            if out.requires_grad:
                out.register_hook(lambda grad: setattr(acc, "region", "activations"))

        handles.append(self.model.norm.register_forward_hook(after_norm))
        return handles

    def label_state(self) -> None:
        label_model_state(self.acc, self.model, self.optimizers)  # one optimizer, or one a parameter (in backward)

    def loss_step(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The recipe's _loss_step: forward, labels shifted with the ignore column, the loss."""
        logits = self.model(tokens)
        labels = torch.hstack((labels[..., 1:], self.ignore_labels_cache[: labels.shape[0]]))
        if not isinstance(logits, list):
            labels = labels.reshape(-1)
            logits = logits.reshape(-1, logits.size(-1))
        loss = self.loss_fn(logits, labels)
        del logits
        return loss

    def step(self, step: int, target: CudaTarget) -> dict:
        """The recipe's step in run.py's traced_step: no mask, no clipping; the loss times the token count, and
        scale_grads by it before the optimizer step (none with optimizer_in_backward: the hooks stepped)."""
        from torchtune import training

        s = self.s
        counted = []  # the token count: made with the forward, read again by the optimizer step

        def new_batch() -> Batch:
            tokens = torch.randint(0, s.model.vocab_size, (s.micro_batch, s.seq_len))
            return Batch({"tokens": tokens, "labels": tokens.clone()}, None, None)

        def forward_loss(batch: Batch) -> torch.Tensor:
            counted.append((batch.kwargs["labels"] != IGNORE_INDEX).sum())
            return self.loss_step(batch.kwargs["tokens"], batch.kwargs["labels"]) * counted[0]

        def optimizer_step() -> None:
            if not s.optimizer_in_backward:
                training.scale_grads(self.model, 1 / counted[0])
                self.optimizers[0].step()
                self.optimizers[0].zero_grad(set_to_none=True)

        return traced_step(self.acc, step, target, self.label_state, new_batch, forward_loss, optimizer_step)


def run_torchtune_trace(s: Scenario, steps: int = 2, *, num_layers: int | None = None,
                        target: CudaTarget | None = None) -> TraceResult:
    """`steps` recipe steps of `s` on torchtune's model, every tensor accounted (the last step is the profile)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    check_supported(s)
    if num_layers is not None:
        s = replace(s, model=replace(s.model, num_layers=num_layers))
    target = target or CudaTarget.for_gpu(s.hardware.gpu)
    started = time.perf_counter()
    acc = Accountant()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = build_torchtune_model(s, fake_mode)
    with fake_mode:
        recipe = _Recipe(s, model, acc)
    kernels: dict = {}
    try:
        with fake_mode, acc:
            for step in range(steps):
                kernels = recipe.step(step, target)
    finally:
        for h in recipe.handles:
            h.remove()
    last = steps - 1
    marks = {name.split("@")[0]: b for name, b in acc.marks.items() if name.endswith(f"@{last}")}
    result = TraceResult(acc.profile(last), acc.timeline, time.perf_counter() - started, steps, marks, kernels,
                         _notes(s), {}, _summary(s))
    result.extras = _extras(result)
    return result


def _summary(s: Scenario) -> dict:
    m = s.model
    return {"model": m.id, "layers": m.num_layers, "builder": builder_name(m), "tuning": s.tuning,
            "optimizer": s.optimizer, "optimizer_in_backward": s.optimizer_in_backward,
            "checkpointing": s.checkpointing, "loss": s.loss, "micro_batch": s.micro_batch, "seq_len": s.seq_len,
            "lora_rank": s.lora_rank if s.tuning == "lora" else None, "torchtune": torchtune_version()}


def _notes(s: Scenario) -> list[str]:
    return [f"torchtune {torchtune_version()}'s model ({builder_name(s.model)} builder) and single-device recipe step",
            "fake tensors on the CPU; SDPA picks CUDA kernels (memfit/trace/cuda.py)",
            "not modelled: CUDA context, cuBLAS workspace, allocator cache/fragmentation"]


# ---------------------------------------------------------------------------------------------- command line
def scenario_of(model: str, knobs: dict, num_layers: int | None = None) -> Scenario:
    """The torchtune-profile Scenario of a catalog model and knobs (on an A100 80GB), optionally fewer layers."""
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware

    s = build_scenario(find_model(model), Hardware(gpu=find_gpu("a100-80gb")), knobs, "torchtune")
    return replace(s, model=replace(s.model, num_layers=num_layers)) if num_layers else s


def main(argv: list[str] | None = None) -> int:
    """Trace rows given as JSON ([[model, knobs, layers], ...]) and print each one's profile as JSON: how the
    main environment reaches the torchtune venv (tests/trace/test_torchtune.py)."""
    import argparse
    import json
    import warnings

    parser = argparse.ArgumentParser(description="trace torchtune recipe steps; print their profiles as JSON")
    parser.add_argument("rows", help='JSON: [["meta-llama/Llama-3.2-1B", {"tuning": "lora"}, 2], ...]')
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    try:
        rows = [scenario_of(model, knobs, layers) for model, knobs, layers in json.loads(args.rows)]
    except (ValueError, TypeError, MemfitError) as e:  # malformed JSON or rows, unknown models or knobs
        parser.exit(2, f"memfit: error: rows {args.rows!r}: {e}\n")
    out = []
    for s in rows:
        result = run_torchtune_trace(s)
        out.append({"profile": result.profile.to_json(), "torchtune": torchtune_version(), "notes": result.notes})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
