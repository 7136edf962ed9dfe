"""Derive the [model_code] facts of memfit/facts/data/frameworks/litgpt.toml from LitGPT's own training step.

    .venvs/litgpt/bin/python -m memfit.trace.litgpt_facts           # print the block
    .venvs/litgpt/bin/python -m memfit.trace.litgpt_facts --write   # replace it in litgpt.toml

Logits and loss: LitGPT's loop keeps `logits` (cast to fp32 by Fabric's bf16-true convert_output) from one
iteration's forward to the next one's, and chunked_cross_entropy keeps each chunk's fp32 log_softmax. Their bytes
are linear in the tokens n and, for the lm_head-chunked methods, in the chunk: bytes = a * n * V + b * c * V
(V the padded vocabulary, c = 128 positions of a one-row micro-batch). Two traces that differ only in the sequence length give a and b exactly
(what `memfit.trace.run.layer_profile` does with layers). Measured on one decoder layer of a Llama-3.2-1B config:
the logits part does not depend on the layers.
"""
from __future__ import annotations

import sys
from pathlib import Path

from memfit.trace.litgpt import HEAD_CHUNK, LitRun, litgpt_version, trace

CONFIG = "Llama-3.2-1B"
LENGTHS = (256, 512)
# kind -> (script, micro-batch): full.py forwards without lm_head_chunk_size and shifts the logits with a slice whose
# reshape copies them when the micro-batch has more than one row
KINDS = {"chunked": ("lora", 1), "full": ("full", 1), "full_batched": ("full", 2)}
TOML = Path(__file__).resolve().parents[1] / "facts" / "data" / "frameworks" / "litgpt.toml"
MARKER = "# ---- derived by memfit/trace/litgpt_facts.py: do not edit below by hand"


def _measures(result: dict) -> dict[str, int]:
    """logits_loss bytes at the moments the memory model uses: the largest of each phase, whatever else is live."""
    return {
        "forward_peak": result["logits_max"]["forward"],  # the previous step's logits included
        "saved": result["marks"]["forward_end"].get("logits_loss", 0),
        "backward_peak": result["logits_max"]["backward"],
        "kept": result["marks"]["step_end"].get("logits_loss", 0),  # the loop variable, alive between steps
    }


def derive(kind: str) -> dict[str, list[float]]:
    """name -> [bytes per token x vocab, bytes per chunk row x vocab]."""
    method, rows = KINDS[kind]
    short, long = (trace(LitRun(CONFIG, method, micro_batch=rows, seq_len=n // rows, n_layer=1)) for n in LENGTHS)
    vocab = short["vocab"]
    n1, n2 = LENGTHS  # tokens of the micro-batch
    out = {}
    for name, y1 in _measures(short).items():
        y2 = _measures(long)[name]
        a = (y2 - y1) / ((n2 - n1) * vocab)
        b = (y1 - a * n1 * vocab) / (HEAD_CHUNK * vocab) if kind == "chunked" else 0.0
        out[name] = [round(a, 2), round(b, 2)]  # 512-byte blocks leave < 0.01 of noise
    return out


def block() -> str:
    import torch

    lines = [MARKER, "[model_code.logits]",
             f'litgpt = "{litgpt_version()}"', f'torch = "{torch.__version__.split("+")[0]}"',
             f'traced = "{CONFIG}, one layer, {LENGTHS[0]} and {LENGTHS[1]} tokens (full_batched: two rows), bf16-true"']
    for kind in KINDS:
        lines.append("")
        lines.append(f"[model_code.logits.{kind}]  # [bytes per token x vocab, per chunk row x vocab]")
        lines += [f"{name} = {value}" for name, value in derive(kind).items()]
    return "\n".join(lines) + "\n"


def write(text: str) -> None:
    head = TOML.read_text().split(MARKER)[0].rstrip("\n")
    TOML.write_text(head + "\n\n" + text)


def main(argv: list[str]) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    text = block()
    if "--write" in argv:
        write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
