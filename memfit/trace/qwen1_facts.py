"""Derive the [qwen.derived] facts of memfit/facts/data/remote_code.toml from Qwen-1's own modeling_qwen.py.

    PYTHONPATH=/tmp/tf/4.44.2:. MEMFIT_QWEN1_SOURCE=/tmp/qwen1 python -m memfit.trace.qwen1_facts           # print
    ... python -m memfit.trace.qwen1_facts --write   # replace the derived block
    ... python -m memfit.trace.qwen1_facts --check   # exit 1 when the shipped block differs from a re-derivation

Steps of a two-row micro-batch of Qwen-7B shapes (one and two decoder layers, fake tensors; memfit/trace/qwen1.py),
for each setup of SETUPS (under autocast; a 16-bit module without it), are read at the end of forward, where every
storage alive is named by the op, shape and dtype that made it:
- fused_qkv_kept: c_attn outputs (rows x T x 3 x heads x head_dim) alive per layer. The file splits c_attn's
  output into q, k, v views; rotary makes new q and k, but v goes to the kernel as a view, and the kernel saves it,
  so the whole fused output stays (the transformers twin keeps a v_proj output of one third of it);
- mask_padded / mask_causal: bytes per T x T position a layer saves of its attention mask, per row of a padded
  batch (finetune.py's attention_mask: the file expands it to rows x 1 x T x T and fills the causal part, in every
  layer) and for a batch without a mask (its bool tril(T x T), which SDPA turns into an additive mask in the
  compute dtype); SDPA with a mask runs the memory-efficient kernel, which saves it;
- shared_mask: bytes per row x T x T built once per forward and shared by the layers (the twin's bool mask);
- rotary_cache: bytes per cached position x head_dim of the fp32 cos and sin the module keeps between steps
  (RotaryEmbedding caches max(2 x T, 16) positions);
- logits / logits_one_row: bytes per logit element (forward peak, saved, backward peak), slopes over two token
  counts, for two rows and for one: lm_head's bf16 logits, the loss's shifted .contiguous() copy (a copy only when
  the micro-batch has more than one row: the first T-1 positions of a single row are already contiguous), CUDA
  autocast's log_softmax of bf16 input (an fp32 copy, then an fp32 output saved; the file itself does not upcast);
- eager_scores / eager_mask / eager_shared_mask: the file's `_attn` path (memfit's attention "eager": what it
  runs on torch < 2, and what hub revisions before 2023-10-14 run on any torch): bytes per head x T x T of a row
  a layer keeps of its scores (CUDA autocast's fp32 softmax output, and its bf16 cast PV reads), bytes per T x T
  a layer keeps of its bool causal mask (torch.where keeps the condition), and of a mask shared by the layers;
- eager_forward / eager_backward: bytes per head x T x T of a row `_attn` holds on top (see _eager_transients);
- checkpoint_reentrant: read from the file: it calls torch.utils.checkpoint.checkpoint without use_reentrant.
"""
from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

from memfit.errors import MemfitError
from memfit.trace import qwen1

MODEL = "Qwen/Qwen-7B"
ROWS = 2
LENGTHS = (256, 512)
SMALL_VOCAB = 512  # transients: a vocabulary whose logits stay below one layer's attention
TRANSIENT_LENGTHS = (4096, 8192)  # long enough that the attention's T x T, not the MLP, makes the layer's peak
TOML = Path(__file__).resolve().parents[1] / "facts" / "data" / "remote_code.toml"
MARKER = "# ---- derived by memfit/trace/qwen1_facts.py: do not edit below by hand"
# HF Trainer's bf16=True over the bf16 model (autocast with CUDA's lists), and a 16-bit module without autocast
# (DeepSpeed / FSDP run the module in bf16 and leave autocast off)
SETUPS = {"autocast": {}, "plain": {"autocast": False}}
SETUPS_SAID = {"autocast": "bf16 weights under bf16 autocast with CUDA's op lists (HF Trainer bf16=True)",
               "plain": "bf16 weights, no autocast (a DeepSpeed / FSDP 16-bit module)"}
LORA = {"tuning": "lora", "lora_rank": 64, "lora_alpha": 16, "lora_dropout": 0.05,
        "lora_targets": ("c_attn", "attn.c_proj", "w1", "w2", "mlp.c_proj")}


def _scenario(knobs: dict):
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware

    base = {"micro_batch": ROWS, "checkpointing": "off"} | LORA
    return build_scenario(find_model(MODEL), Hardware(gpu=find_gpu("a100-80gb")), base | knobs, "hf-trainer")


def _shape(origin: str) -> tuple[tuple[int, ...], str]:
    """'aten.add.Tensor (2, 256, 12288) bfloat16' -> ((2, 256, 12288), 'bfloat16')."""
    found = re.search(r"\(([\d, ]*)\) (\w+)$", origin)
    if found is None:
        raise MemfitError(f"trace origin {origin!r} names no shape and dtype (expected e.g. 'aten.add.Tensor "
                          "(2, 256, 12288) bfloat16')")
    return tuple(int(x) for x in found.group(1).split(",") if x.strip()), found.group(2)


def _storages(t: qwen1.Qwen1Trace, mark: str, category: str = "activations") -> list[tuple[int, tuple, str]]:
    return [(b, *_shape(o)) for b, c, o in t.live[mark] if c == category]


def _layer_facts(seq: int, pad_tokens: int, setup: dict) -> dict:
    """Per-layer counts at the end of forward: two layers minus one."""
    def count(layers: int) -> dict:
        s = _scenario({"seq_len": seq} | setup)
        m = s.model
        t = qwen1.trace(s, layers=layers, pad_tokens=pad_tokens, origins=True)
        live = _storages(t, "forward_end")
        fused = sum(1 for _, shape, _ in live if shape == (ROWS, seq, 3 * m.num_heads * m.head_dim))
        masks = sum(b for b, shape, _ in live if shape[-2:] == (seq, seq))
        rotary = sum(b for b, shape, dtype in _storages(t, "step_end") if len(shape) == 4 and shape[1] == 2 * seq)
        return {"fused": fused, "masks": masks, "rotary": rotary, "head_dim": m.head_dim}
    one, two = count(1), count(2)
    per_layer_mask = two["masks"] - one["masks"]
    return {"fused_qkv_kept": two["fused"] - one["fused"], "mask": per_layer_mask / seq ** 2,
            "shared_mask": (one["masks"] - per_layer_mask) / (ROWS * seq ** 2),
            "rotary_cache": one["rotary"] / (2 * seq * one["head_dim"])}


def _eager_facts(seq: int, setup: dict) -> dict:
    """The file's `_attn` path (attention "eager"), per layer at the end of forward: bytes per head x T x T of a row
    kept of the scores (softmax output, its cast for PV), and bytes per T x T of its bool causal mask (torch.where
    keeps its condition); two layers minus one."""
    def count(layers: int) -> tuple[int, int, int]:
        s = _scenario({"seq_len": seq, "attention": "eager"} | setup)
        t = qwen1.trace(s, layers=layers, origins=True)
        live = _storages(t, "forward_end")
        scores = sum(b for b, shape, _ in live if shape == (ROWS, s.model.num_heads, seq, seq))
        masks = sum(b for b, shape, dtype in live if shape[-2:] == (seq, seq) and dtype == "bool")
        return scores, masks, s.model.num_heads
    (s1, m1, heads), (s2, m2, _) = count(1), count(2)
    return {"eager_scores": (s2 - s1) / (ROWS * heads * seq ** 2), "eager_mask": (m2 - m1) / seq ** 2,
            "eager_shared_mask": (2 * m1 - m2) / seq ** 2}


def _eager_transients(setup: dict) -> dict:
    """Bytes per head x T x T of a row the file's `_attn` holds beyond what a layer keeps: in a checkpointed
    (no-grad) forward, the peak over the end of forward (the masked scores, autocast's fp32 copy and the softmax
    output at once); without checkpointing, the backward peak over the end of forward (what is still saved and the
    gradients of the scores). One layer, a small vocabulary (so the loss is not the peak), the T x T part of
    two token counts long enough for the attention to make the peak (x = a T + c T^2)."""
    def excess(seq: int, ckpt: str, phase: str) -> tuple[int, int]:
        s = _scenario({"seq_len": seq, "attention": "eager", "checkpointing": ckpt} | setup)
        s = replace(s, model=replace(s.model, vocab_size=SMALL_VOCAB))
        t = qwen1.trace(s, layers=1)
        return t.phases[phase]["activations"] - t.marks["forward_end"]["activations"], s.model.num_heads

    out = {}
    for name, ckpt, phase in (("eager_forward", "full", "forward"), ("eager_backward", "off", "backward")):
        (x1, heads), (x2, _) = (excess(seq, ckpt, phase) for seq in TRANSIENT_LENGTHS)
        (t1, t2) = TRANSIENT_LENGTHS
        out[name] = round((x2 / t2 - x1 / t1) / (t2 - t1) / (ROWS * heads), 2)
    return out


def _logits(rows: int, setup: dict) -> list[float]:
    """Slopes of the logits/loss bytes over two token counts, per logit element (LoRA: the head saves nothing)."""
    points = []
    for seq in LENGTHS:
        s = _scenario({"seq_len": seq, "micro_batch": rows} | setup)
        t = qwen1.trace(s, layers=1)
        points.append((s.tokens_per_micro_batch, [t.phases["forward"]["logits_loss"],
                                                  t.marks["forward_end"]["logits_loss"],
                                                  t.phases["backward"]["logits_loss"]]))
    (n1, y1), (n2, y2) = points
    vocab = _scenario({}).model.vocab_size
    return [round((b - a) / ((n2 - n1) * vocab), 2) for a, b in zip(y1, y2)]


def _reentrant(text: str) -> bool:
    """The file's own checkpoint call passes no use_reentrant: torch's default, reentrant (torch <= 2.13)."""
    return "torch.utils.checkpoint.checkpoint(" in text and "use_reentrant" not in text


def derive_setup(setup: dict) -> dict:
    padded = _layer_facts(LENGTHS[0], 1, setup)
    causal = _layer_facts(LENGTHS[0], 0, setup)
    return {"fused_qkv_kept": padded["fused_qkv_kept"], "mask_padded": padded["mask"] / ROWS,
            "mask_causal": causal["mask"], "shared_mask": padded["shared_mask"], **_eager_facts(LENGTHS[0], setup),
            **_eager_transients(setup),
            "rotary_cache": padded["rotary_cache"], "logits": _logits(ROWS, setup),
            "logits_one_row": _logits(1, setup)}


def derive() -> dict:
    out: dict = {"checkpoint_reentrant": _reentrant((qwen1.source_dir() / "modeling_qwen.py").read_text())}
    return out | {name: derive_setup(setup) for name, setup in SETUPS.items()}


def block() -> str:
    import peft
    import torch
    import transformers

    d = derive()
    lines = [MARKER, "[qwen.traced]",
             f'transformers = "{transformers.__version__}"  # the file asks 4.32 .. 4.37; transformers 5 lacks its get_head_mask',
             f'torch = "{torch.__version__.split("+")[0]}"', f'peft = "{peft.__version__}"',
             f'modeling_qwen_sha256 = "{qwen1.file_sha256()}"',
             f'how = "{MODEL} shapes, 1 and 2 layers, {ROWS} rows of {LENGTHS[0]} and {LENGTHS[1]} tokens (eager transients: '
             f'{TRANSIENT_LENGTHS[0]} and {TRANSIENT_LENGTHS[1]}, vocabulary {SMALL_VOCAB}), fake tensors; '
             'LoRA r64 on c_attn, c_proj, w1, w2; the non-flash path, '
             'SDPA kernels picked by CUDA sm80 rules (memfit/trace/cuda.py)"', "", "[qwen.derived]"]
    def text(value) -> str:
        return "true" if value is True else "false" if value is False else str(value)
    lines += [f"{key} = {text(value)}" for key, value in d.items() if not isinstance(value, dict)]
    for name, facts in d.items():
        if isinstance(facts, dict):
            lines += ["", f"[qwen.derived.{name}]  # {SETUPS_SAID[name]}"]
            lines += [f"{key} = {text(value)}" for key, value in facts.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    if not qwen1.available():
        print(f"modeling_qwen.py not found in {qwen1.source_dir()} (set MEMFIT_QWEN1_SOURCE)", file=sys.stderr)
        return 2
    text = block()
    head = TOML.read_text().split(MARKER)[0].rstrip("\n")
    if "--check" in argv:
        same = TOML.read_text() == head + "\n\n" + text
        print("remote_code.toml [qwen] matches the re-derivation" if same else "remote_code.toml [qwen] differs:\n" + text)
        return 0 if same else 1
    if "--write" in argv:
        TOML.write_text(head + "\n\n" + text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
