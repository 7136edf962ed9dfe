"""GLM-4-9B-chat on its own modeling code: memfit's estimate vs a trace of modeling_chatglm.py, per phase.

    python bench/glm4.py            # the table, from bench/glm4.json (no fetched file needed)
    PYTHONPATH=/tmp/tf/4.44.2:. MEMFIT_GLM4_SOURCE=/tmp/glm4 python bench/glm4.py --trace   # re-trace, rewrite
    ... python bench/glm4.py --trace-missing   # trace only the rows bench/glm4.json lacks

Rows are OpenRLHF DPO steps (memfit/trace/dpo.py: chosen and rejected concatenated, the policy's fp32 log-probs, a
separate frozen bf16 reference under no_grad, DPOLoss) on one device: full fine-tuning, bf16 weights without
autocast (what DeepSpeed runs), AdamW; the file's eager CoreAttention (OpenRLHF <= 0.8 without --flash_attn) or its
SdpaAttention; micro-batch 1 (2 rows) or 2 (4 rows), the last row one padding position short. Checkpointing
"asked": --gradient_checkpointing, which the file's gradient_checkpointing_enable leaves off (both sides);
"set": the flag set as LLaMA-Factory's replacement method does (the trace sets it; the estimate is told so). All
40 layers on fake tensors (memfit/trace/glm4.py); both sides leave out the CUDA context, the allocator's cache and
DeepSpeed's buffers (the trace has no engine).
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import remote_traces  # noqa: E402

OUT = Path(__file__).with_suffix(".json")
MODEL = "THUDM/glm-4-9b-chat"
BASE = {"method": "dpo", "engine": "single", "tuning": "full", "precision": "bf16-pure", "optimizer": "adamw-foreach",
        "padding": "padded"}
PHASES = ("forward", "backward", "optimizer_step")
COMPARED = ("weights", "gradients", "optimizer_states", "activations", "logits_loss")


def rows() -> list[dict]:
    """knobs (memfit names) plus "checkpointing_set": whether the layers' flag is set beyond the framework's call."""
    asked = [{"attention": "eager", "micro_batch": 1, "seq_len": n, "checkpointing": "full"}
             for n in (512, 1024, 2048, 4096, 8192)]
    asked += [{"attention": "sdpa", "micro_batch": 1, "seq_len": n, "checkpointing": "full"} for n in (2048, 8192)]
    asked += [{"attention": "eager", "micro_batch": 2, "seq_len": n, "checkpointing": "full"} for n in (512, 2048)]
    asked.append({"attention": "eager", "micro_batch": 1, "seq_len": 2048, "checkpointing": "off"})
    set_ = [{"attention": a, "micro_batch": 1, "seq_len": n, "checkpointing": "full", "checkpointing_set": True}
            for a, n in (("eager", 2048), ("eager", 8192), ("sdpa", 8192))]
    return asked + set_


def scenario(row: dict):
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware

    knobs = {k: v for k, v in row.items() if k != "checkpointing_set"}
    s = build_scenario(find_model(MODEL), Hardware(gpu=find_gpu("a100-80gb")), BASE | knobs, "openrlhf")
    # a framework that sets the layers' flag itself (LLaMA-Factory): the checkpointing asked for happens
    return replace(s, checkpointing=row["checkpointing"]) if row.get("checkpointing_set") else s


def traced(keep: list | None = None) -> dict:
    """Trace every row on GLM-4's own code (needs the fetched file and transformers < 5 first on the path); rows
    in `keep` (traced before, of the same file) are not traced again."""
    from memfit.trace import glm4

    def trace_row(knobs: dict) -> dict:
        t = glm4.trace(scenario(knobs), honor_checkpointing=knobs.get("checkpointing_set", False))
        return {"knobs": knobs, "kernels": t.kernels, "checkpointed": t.checkpointed,
                "phases": {p: sum(t.phases[p][c] for c in COMPARED) for p in PHASES}}

    return remote_traces.traced(MODEL, "chatglm", "glm4", "modeling_chatglm_sha256", rows(), trace_row, keep)


def estimated(knobs: dict) -> dict[str, int]:
    """memfit's allocated bytes per phase in the compared categories."""
    from memfit.roles.estimate import estimate

    phases = estimate(scenario(knobs)).allocated.phases
    return {p: sum(phases[p].get(c) for c in COMPARED) for p in PHASES}


def table(data: dict) -> list[tuple]:
    """(attention, rows, tokens, checkpointing, traced peak, estimated peak, error) per row; peaks over the step's
    phases."""
    out = []
    for row in data["rows"]:
        k = row["knobs"]
        est = estimated(k)
        t, e = max(row["phases"].values()), max(est.values())
        ck = "off" if k["checkpointing"] == "off" else "set" if k.get("checkpointing_set") else "asked"
        out.append((k["attention"], 2 * k["micro_batch"], k["seq_len"], ck, t, e, (e - t) / t))
    return out


def main(argv: list[str]) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    data = remote_traces.saved(OUT, "glm4", "modeling_chatglm_sha256", traced, argv)
    print(f"{MODEL} OpenRLHF DPO step on modeling_chatglm.py ({data['source']['repo']}@{data['source']['commit'][:10]}),"
          f" traced with transformers {data['transformers']}, torch {data['torch']}; peak allocated GiB (weights, "
          "grads, optimizer, activations, logits)")
    print(f"{'attn':>5} {'rows':>4} {'tokens':>6} {'ckpt':>5} {'traced':>8} {'memfit':>8} {'error':>7}")
    for attn, rows_, n, ck, t, e, err in table(data):
        print(f"{attn:>5} {rows_:>4} {n:>6} {ck:>5} {t / 2**30:8.2f} {e / 2**30:8.2f} {err:+7.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
