"""Qwen-1 (Qwen-7B) on its own modeling code: memfit's estimate vs a trace of modeling_qwen.py, per phase.

    python bench/qwen1.py            # the table, from bench/qwen1.json (no fetched file needed)
    PYTHONPATH=/tmp/tf/4.44.2:. MEMFIT_QWEN1_SOURCE=/tmp/qwen1 python bench/qwen1.py --trace   # re-trace, rewrite
    ... python bench/qwen1.py --trace-missing   # trace only the rows bench/qwen1.json lacks

Rows are finetune.py's (QwenLM/Qwen) settings on one A100: bf16 weights under HF Trainer's bf16 autocast, AdamW,
one padded row of --model_max_length tokens (and two rows, as finetune_lora_single_gpu.sh); LoRA with its LoraArguments defaults (r 64, alpha 16, dropout 0.05
on c_attn, c_proj, w1, w2) or full fine-tuning; gradient checkpointing on or off. The trace runs all 32 layers
on fake tensors (memfit/trace/qwen1.py); both sides leave out the CUDA context and the allocator's cache.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import remote_traces  # noqa: E402

OUT = Path(__file__).with_suffix(".json")
MODEL = "Qwen/Qwen-7B"
LORA = {"tuning": "lora", "lora_rank": 64, "lora_alpha": 16, "lora_dropout": 0.05,
        "lora_targets": ["c_attn", "attn.c_proj", "w1", "w2", "mlp.c_proj"]}
LENGTHS = (256, 1024, 4096, 8192)
PHASES = ("forward", "backward", "optimizer_step")


def rows() -> list[dict]:
    one = [dict(base, seq_len=n, checkpointing=ck) for base in (LORA, {"tuning": "full"})
           for ck in ("full", "off") for n in LENGTHS]
    # finetune_lora_single_gpu.sh: two rows a micro-batch (the loss's shifted copy is a real copy), checkpointing
    two = [dict(LORA, micro_batch=2, seq_len=n, checkpointing=ck) for ck, n in
           (("full", 512), ("full", 2048), ("full", 8192), ("off", 2048))]
    # the file's `_attn` path (memfit's attention "eager"): torch < 2, or hub revisions before 2023-10-14
    eager = [dict(LORA, attention="eager", seq_len=n, checkpointing=ck) for ck, n in
             (("full", 1024), ("full", 4096), ("full", 8192), ("off", 1024), ("off", 4096))]
    eager.append({"tuning": "full", "attention": "eager", "seq_len": 4096, "checkpointing": "full"})
    # a bf16 module without autocast, as DeepSpeed / FSDP run it (finetune_ds.sh): the file's loss stays in bf16
    plain = [dict(LORA, autocast=False, micro_batch=2, seq_len=8192, checkpointing="full"),
             {"tuning": "full", "autocast": False, "seq_len": 2048, "checkpointing": "full"},
             {"tuning": "full", "autocast": False, "seq_len": 4096, "checkpointing": "off"},
             dict(LORA, autocast=False, attention="eager", seq_len=4096, checkpointing="off")]
    return one + two + eager + plain


def scenario(knobs: dict):
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware

    return build_scenario(find_model(MODEL), Hardware(gpu=find_gpu("a100-80gb")), knobs, "hf-trainer")


def traced(keep: list | None = None) -> dict:
    """Trace every row on Qwen-1's own code (needs the fetched file and transformers < 5 first on the path); rows
    in `keep` (traced before, of the same file) are not traced again."""
    from memfit.trace import qwen1

    def trace_row(knobs: dict) -> dict:
        t = qwen1.trace(scenario(knobs))
        return {"knobs": knobs, "kernels": t.kernels, "phases": {p: t.phases[p]["total"] for p in PHASES}}

    return remote_traces.traced(MODEL, "qwen", "qwen1", "modeling_qwen_sha256", rows(), trace_row, keep)


def estimated(knobs: dict) -> dict[str, int]:
    """memfit's allocated bytes per phase, without the runtime overhead (the trace has no CUDA context)."""
    from memfit.roles.estimate import estimate

    phases = estimate(scenario(knobs)).allocated.phases
    return {p: phases[p].total - phases[p].get("runtime_overhead") for p in PHASES}


def table(data: dict) -> list[tuple]:
    """(tuning, attention, autocast, rows, tokens, checkpointing, traced peak, estimated peak, error) per row; peaks
    over the step's phases."""
    out = []
    for row in data["rows"]:
        k = row["knobs"]
        est = estimated(k)
        t, e = max(row["phases"].values()), max(est.values())
        out.append((k["tuning"], k.get("attention", "sdpa"), "off" if k.get("autocast") is False else "bf16",
                    k.get("micro_batch", 1), k["seq_len"], k["checkpointing"], t, e, (e - t) / t))
    return out


def main(argv: list[str]) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    data = remote_traces.saved(OUT, "qwen1", "modeling_qwen_sha256", traced, argv)
    print(f"{MODEL} on modeling_qwen.py ({data['source']['repo']}@{data['source']['commit'][:10]}), traced with "
          f"transformers {data['transformers']}, torch {data['torch']}; peak allocated GiB")
    print(f"{'tuning':6} {'attn':>5} {'autocast':>8} {'rows':>4} {'tokens':>6} {'ckpt':>5} {'traced':>8} {'memfit':>8} "
          f"{'error':>7}")
    for tuning, attn, autocast, rows_, n, ck, t, e, err in table(data):
        print(f"{tuning:6} {attn:>5} {autocast:>8} {rows_:>4} {n:>6} {ck:>5} {t / 2**30:8.2f} {e / 2**30:8.2f} "
              f"{err:+7.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
