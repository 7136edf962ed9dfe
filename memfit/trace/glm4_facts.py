"""Derive the [chatglm.derived] facts of memfit/facts/data/remote_code.toml from GLM-4's own modeling_chatglm.py.

    PYTHONPATH=/tmp/tf/4.44.2:. MEMFIT_GLM4_SOURCE=/tmp/glm4 python -m memfit.trace.glm4_facts           # print
    ... python -m memfit.trace.glm4_facts --write   # replace the derived block
    ... python -m memfit.trace.glm4_facts --check   # exit 1 when the shipped block differs from a re-derivation

checkpointing_enable_sets_flag: whether the file's gradient_checkpointing_enable (what OpenRLHF's Actor and HF
Trainer call) turns on the flag its GLMTransformer reads: called on a one-layer model and looked at.
checkpoint_reentrant: read from the file (its own torch.utils.checkpoint call passes use_reentrant=False).

[plain] (bf16 weights, no autocast: DeepSpeed under OpenRLHF), from OpenRLHF DPO steps of GLM-4-9B shapes (the
policy's two rows, one and two decoder layers, fake tensors; memfit/trace/glm4.py), read at the end of forward,
where every storage alive is named by the op, shape and dtype that made it:
- norm_fp32: fp32 bytes per token x hidden unit one RMSNorm keeps (its fp32 input copy, and the fp32 normalized
  tensor the trainable weight's multiply keeps: the file casts to 16 bits only after the weight);
- norm_input: 16-bit bytes per token x hidden unit one RMSNorm keeps of its input (the residual sum), kept by its
  multiply with the fp32 rsqrt;
- mask_padded: bytes per row x T x T of the padded batch's mask (get_masks' bool, shared by the layers);
- eager_mask_causal: bytes per row x T x T each eager layer keeps of the causal mask it builds itself when the
  batch has no padding;
- kv_repeated: the layers keep K and V expanded to every query head (expand + contiguous before attention).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from memfit.trace import glm4

MODEL = "THUDM/glm-4-9b-chat"
ROWS = 2  # OpenRLHF DPO, micro-batch 1: the chosen and the rejected row
SEQ = 256
TOML = Path(__file__).resolve().parents[1] / "facts" / "data" / "remote_code.toml"
MARKER = "# ---- derived by memfit/trace/glm4_facts.py: do not edit by hand down to the end marker"
END = "# ---- end of the glm4_facts.py block"


def scenario(knobs: dict):
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware

    base = {"method": "dpo", "engine": "single", "tuning": "full", "precision": "bf16-pure",
            "optimizer": "adamw-foreach", "micro_batch": ROWS // 2, "seq_len": SEQ, "padding": "padded",
            "checkpointing": "off", "attention": "eager"}
    return build_scenario(find_model(MODEL), Hardware(gpu=find_gpu("a100-80gb")), base | knobs, "openrlhf")


def _storages(attention: str, pad_tokens: int, layers: int) -> list[tuple[int, str, tuple, str]]:
    """(bytes, op, shape, dtype) of the activations alive at the end of the policy's forward."""
    t = glm4.trace(scenario({"attention": attention}), layers=layers, pad_tokens=pad_tokens, origins=True,
                   reference=False)
    out = []
    for b, category, origin in t.live["forward_end"]:
        found = re.fullmatch(r"(\S+) \(([\d, ]*)\) (\w+)", origin)
        if category == "activations" and found:
            shape = tuple(int(x) for x in found.group(2).split(",") if x.strip())
            out.append((b, found.group(1), shape, found.group(3)))
    return out


def _per_layer(attention: str, pad_tokens: int, pick) -> tuple[int, int]:
    """(bytes one decoder layer adds, bytes outside the layers) of the storages `pick` selects."""
    one, two = (sum(b for b, *rest in _storages(attention, pad_tokens, n) if pick(*rest)) for n in (1, 2))
    return two - one, 2 * one - two


def derive_plain() -> dict:
    m = scenario({}).model
    n, h, sq = ROWS * SEQ, m.hidden_size, ROWS * SEQ * SEQ
    hidden = (ROWS, SEQ, h)
    fp32, _ = _per_layer("eager", 1, lambda op, shape, dtype: shape == hidden and dtype == "float32")
    kept, _ = _per_layer("eager", 1, lambda op, shape, dtype: shape == hidden and op == "aten.add.Tensor")
    is_mask = lambda op, shape, dtype: shape[-2:] == (SEQ, SEQ) and dtype == "bool"  # noqa: E731
    _, shared = _per_layer("eager", 1, is_mask)
    causal, _ = _per_layer("eager", 0, is_mask)
    group = m.num_heads // m.num_kv_heads
    repeated, _ = _per_layer("sdpa", 1, lambda op, shape, dtype: shape == (ROWS, m.num_kv_heads, group, SEQ,
                                                                           m.head_dim))
    return {"norm_fp32": fp32 / (m.norms_per_layer * n * h), "norm_input": kept / (m.norms_per_layer * n * h),
            "mask_padded": shared / sq, "eager_mask_causal": causal / sq,
            "kv_repeated": repeated == 2 * 2 * ROWS * SEQ * m.num_heads * m.head_dim}


def derive() -> dict:
    text = (glm4.source_dir() / "modeling_chatglm.py").read_text()
    reentrant = "use_reentrant=False" not in text.split("torch.utils.checkpoint.checkpoint(", 1)[1].split(")")[0]
    return {"checkpointing_enable_sets_flag": glm4.checkpointing_enable_sets_flag(),
            "checkpoint_reentrant": reentrant, "plain": derive_plain()}


def _text(value) -> str:
    return "true" if value is True else "false" if value is False else str(value)


def block() -> str:
    import torch
    import transformers

    d = derive()
    lines = [MARKER, "[chatglm.traced]",
             f'transformers = "{transformers.__version__}"  # transformers 5 cannot build the file\'s config',
             f'torch = "{torch.__version__.split("+")[0]}"', f'modeling_chatglm_sha256 = "{glm4.file_sha256()}"',
             f'how = "{MODEL} shapes, 1 and 2 layers, OpenRLHF DPO policy step of {ROWS} rows x {SEQ} tokens (one '
             'padding position, or none), fake tensors; full fine-tuning, bf16 weights, no autocast; eager '
             'CoreAttention and SdpaAttention, SDPA kernels picked by CUDA sm80 rules (memfit/trace/cuda.py)"', "",
             "[chatglm.derived]"]
    lines += [f"{key} = {_text(value)}" for key, value in d.items() if not isinstance(value, dict)]
    lines += ["", "[chatglm.derived.plain]  # bf16 weights, no autocast (a DeepSpeed 16-bit module: OpenRLHF)"]
    lines += [f"{key} = {_text(value)}" for key, value in d["plain"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    if not glm4.available():
        print(f"modeling_chatglm.py not found in {glm4.source_dir()} (set MEMFIT_GLM4_SOURCE)", file=sys.stderr)
        return 2
    text = block()
    whole = TOML.read_text()
    # the block sits between its two markers, before Qwen-1's (qwen1_facts.py keeps its block last in the file)
    head, rest = whole.split(MARKER)[0], whole.split(END)[1]
    if "--check" in argv:
        same = whole.split(MARKER)[1].split(END)[0] == "\n" + text.split(MARKER + "\n", 1)[1]
        print("remote_code.toml [chatglm] matches the re-derivation" if same else
              "remote_code.toml [chatglm] differs:\n" + text)
        return 0 if same else 1
    if "--write" in argv:
        TOML.write_text(head + text + END + rest)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
