"""The real engines (DeepSpeed ZeRO-0..3, DDP, FSDP2) measured on the CPU with 2 gloo ranks, vs memfit.

    python bench/engine.py [--quick | --dpo | --moe] [--summary-json] [--json OUT.json] [--steps 3]

Small Llama and Qwen2 configs (built here as ModelSpecs, published_params=None) run for real with
`memfit.measure`: per row the peak per-rank memory that would be on the GPU, by category, and the host
RAM per node the engine's objects take (offloaded states, pinned buffers, the model while it loads,
checkpoint loads). When `memfit.roles.estimate` exists, its per-rank allocated profile (minus the CUDA-only
runtime overhead, which a CPU run cannot see) and its host profile (minus the per-process baseline) are
the estimate columns. DPO rows run OpenRLHF's layout: the policy engine and a bf16 reference engine
(ZeRO-3 sharded under stage 3, a full replica otherwise, LoRA or not), against `memfit.roles.estimate.estimate`.

--summary-json prints {"n", "within_5pct_fraction", "max_abs_pct_error", "host_within_15pct_fraction"}.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memfit.facts.catalog import ModelSpec, architectures, find_gpu
from memfit.errors import MemfitError
from memfit.facts.scenario import Hardware, Scenario

GIB = 2**30
MIB = 2**20
SHORT = {"weights": "wts", "gradients": "grad", "optimizer_states": "optim", "activations": "act",
         "logits_loss": "logits", "engine_buffers": "buf", "runtime_overhead": "rt"}


def tiny(arch: str, name: str, hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int,
         tie: bool = False) -> ModelSpec:
    family = architectures()[arch]
    return ModelSpec(id=name, arch=arch, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv,
                     head_dim=hidden // heads, intermediate_size=inter, vocab_size=vocab, tie_embeddings=tie,
                     qkv_bias=family.get("qkv_bias", False), linear_names=family.get("linear_names", {}),
                     published_params=None)


LLAMA = tiny("llama", "bench/llama-22m", hidden=384, layers=6, heads=6, kv=2, inter=1024, vocab=16000)
QWEN2 = tiny("qwen2", "bench/qwen2-25m", hidden=512, layers=6, heads=8, kv=2, inter=1408, vocab=16000, tie=True)
# a small Mixtral (8 experts, top-2, stacked expert params in transformers 5); under ZeRO-3 `memfit measure`
# marks MixtralSparseMoeBlock a leaf module as LLaMA-Factory does, so each block is fetched whole
MIXTRAL = replace(tiny("mixtral", "bench/mixtral-33m", hidden=384, layers=4, heads=6, kv=2, inter=768, vocab=8000),
                  num_experts=8, experts_per_token=2, moe_intermediate_size=768)
MICRO_BATCH, SEQ = 2, 128


def scenario(spec: ModelSpec, engine: str = "deepspeed", stage: int = 2, offload: str = "none", pin: bool = True,
             ratio: float = 1.0, sub_group: int | None = None, lora: bool = False, ga: int = 1,
             params: str = "none") -> Scenario:
    h = spec.hidden_size
    hw = Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=2)
    knobs: dict = {}
    if engine == "deepspeed":
        # HF Trainer "auto" fills (docs/knobs.md A.3): bucket h*h, prefetch 0.9*h*h, persistence 10*h
        knobs = dict(zero_stage=stage, offload_optimizer=offload, offload_param=params, pin_memory=pin, ratio=ratio,
                     reduce_bucket_size=h * h, prefetch_bucket_size=int(0.9 * h * h),
                     param_persistence_threshold=10 * h, sub_group_size=sub_group or 1_000_000_000)
    elif engine == "fsdp":
        # memfit measure's FsdpRunner calls fully_shard on each layer and then the model, as a plain loop does (the
        # HF Trainer's accelerate layout is bench/accelerate_fsdp.py's)
        knobs = dict(fsdp_strategy="full_shard", profile="peft-loop")
    return Scenario(model=spec, hardware=hw, engine=engine, **knobs,
                    tuning="lora" if lora else "full", lora_rank=16,
                    precision="bf16-mixed", optimizer="adamw-fused", micro_batch=MICRO_BATCH, seq_len=SEQ,
                    grad_accum=ga)


def dpo_scenario(spec: ModelSpec, stage: int, lora: bool = False) -> Scenario:
    """OpenRLHF train_dpo: the policy on chosen + rejected rows (2 x micro-batch) and a bf16 reference
    engine, ZeRO-3 sharded when the policy runs stage 3, a full replica otherwise (also under LoRA)."""
    # buckets as in the SFT rows (OpenRLHF's "auto" would mean DeepSpeed's defaults: a 5e8-element bucket that
    # dwarfs a 22M model and every DPO term); the reference engine takes the policy's stage-3 sizes, as in OpenRLHF
    return scenario(spec, stage=stage, lora=lora).with_changes(method="dpo", profile="openrlhf", adapter_dtype="bf16")


def dpo_rows() -> list[Scenario]:
    return [dpo_scenario(LLAMA, 2), dpo_scenario(LLAMA, 3), dpo_scenario(LLAMA, 2, lora=True)]


def moe_rows(all_rows: bool = True) -> list[Scenario]:
    # ZeRO-3 + CPU offload on this model skips every step (DeepSpeed finds the grad norm invalid; unexplained,
    # FINDINGS.md), so CPUAdam never builds m, v and the host is not a real run's: only with --moe
    offload = [scenario(MIXTRAL, stage=3, offload="cpu")] if all_rows else []
    return [scenario(MIXTRAL, stage=2), scenario(MIXTRAL, stage=3)] + offload


def label(s: Scenario) -> str:
    if s.method != "sft":
        return f"{s.method} " + label(s.with_changes(method="sft"))
    if s.engine != "deepspeed":
        return {"fsdp": "fsdp2 full_shard"}.get(s.engine, s.engine)
    text = f"z{s.zero_stage}"
    if s.offload_optimizer != "none":
        text += " off" + ("" if s.pin_memory else " nopin")
    if s.offload_param != "none":
        text += "+param"
    if s.ratio < 1:
        text += f" r{s.ratio:g}/sg{s.sub_group_size // 1000}k"
    return text


def rows(quick: bool) -> list[Scenario]:
    if quick:
        m = LLAMA
        return [scenario(m, stage=2), scenario(m, stage=3, offload="cpu"), scenario(m, stage=3, lora=True),
                scenario(m, stage=3, offload="cpu", ratio=0.5, sub_group=1_000_000)]
    out = []
    for m in (LLAMA, QWEN2):
        out += [scenario(m, stage=s) for s in (0, 1, 2, 3)]
        out += [scenario(m, stage=s, offload="cpu") for s in (1, 2, 3)]
        out += [scenario(m, stage=s, offload="cpu", pin=False) for s in (2, 3)]
        out += [scenario(m, stage=3, offload="cpu", ratio=0.5, sub_group=1_000_000)]
        out += [scenario(m, stage=3, offload="cpu", params="cpu")]
        out += [scenario(m, stage=2, lora=True), scenario(m, stage=3, lora=True)]
        out += [scenario(m, stage=2, ga=4), scenario(m, stage=3, offload="cpu", ga=4)]
    out += [scenario(LLAMA, engine="ddp"), scenario(LLAMA, engine="fsdp")]
    return out + dpo_rows() + moe_rows(all_rows=False)


def _estimate(s: Scenario):
    try:
        from memfit.roles.estimate import estimate
    except ImportError:
        return None
    try:
        return estimate(s)
    except MemfitError as e:
        return str(e)


def _without(profile, category: str) -> dict[str, int]:
    """Per phase total without one category (the CUDA-only runtime overhead / the process baseline)."""
    return {p: b.total - b.get(category) for p, b in profile.phases.items()}


def compare(s: Scenario, result) -> dict:
    rank = max(result.ranks, key=lambda r: r.device.peak.total)
    dev = rank.device.peak
    host_by_phase: dict[str, int] = {}
    for r in result.ranks:
        for phase, b in r.host.phases.items():
            host_by_phase[phase] = host_by_phase.get(phase, 0) + b.total
    row = {
        "model": s.model.id, "config": label(s), "tuning": s.tuning, "ga": s.grad_accum,
        "params": result.params_total, "trainable": result.params_trainable,
        "rank": rank.rank, "peak_phase": rank.device.peak_phase, "measured": dev.total,
        "parts": {c: dev.get(c) for c in SHORT if dev.get(c)},
        "host_measured": max(host_by_phase.values(), default=0),
        "host_peak_phase": max(host_by_phase, key=host_by_phase.get) if host_by_phase else "",
        "pinned": sum(r.pinned_host_bytes for r in result.ranks),
        "rss_peak": result.rss_peak_per_node, "seconds": round(result.wall_seconds, 1),
    }
    est = _estimate(s)
    if est is None or isinstance(est, str):
        row["estimate_error"] = est
        return row
    dev_est = _without(est.allocated, "runtime_overhead")
    host_est = _without(est.host, "runtime_overhead")
    row["estimate"] = max(dev_est.values())
    row["estimate_phase"] = max(dev_est, key=dev_est.get)
    row["host_estimate"] = max(host_est.values())
    row["pct_error"] = 100.0 * (row["estimate"] - row["measured"]) / row["measured"]
    if row["host_measured"]:
        row["host_pct_error"] = 100.0 * (row["host_estimate"] - row["host_measured"]) / row["host_measured"]
    return row


def table(rows_: list[dict]) -> str:
    head = (f"{'model':<17}{'config':<21}{'tune':<5}{'ga':>3} {'peak':<9}{'measured':>9}"
            f"  {'by category (MiB)':<54}{'estimate':>9}{'err%':>7}  {'host/node':>9}{'est':>9}{'err%':>7}{'s':>6}")
    lines = [head, "-" * len(head)]
    for r in rows_:
        parts = " ".join(f"{SHORT[c]}={v / MIB:.1f}" for c, v in r["parts"].items())
        est = f"{r['estimate'] / MIB:9.1f}{r['pct_error']:7.1f}" if "estimate" in r else f"{'-':>9}{'-':>7}"
        host_est = (f"{r['host_estimate'] / MIB:9.1f}{r.get('host_pct_error', 0):7.1f}" if "host_estimate" in r
                    else f"{'-':>9}{'-':>7}")
        lines.append(f"{r['model'][6:]:<17}{r['config']:<21}{r['tuning'][:4]:<5}{r['ga']:>3} {r['peak_phase'][:8]:<9}"
                     f"{r['measured'] / MIB:9.1f}  {parts:<54}{est}  {r['host_measured'] / MIB:9.1f}{host_est}"
                     f"{r['seconds']:6.1f}")
    return "\n".join(lines)


def summary(rows_: list[dict]) -> dict:
    compared = [r for r in rows_ if "pct_error" in r]
    host = [r for r in compared if "host_pct_error" in r]
    n = len(compared)
    return {
        "n": n,
        "within_5pct_fraction": round(sum(abs(r["pct_error"]) <= 5 for r in compared) / n, 3) if n else None,
        "max_abs_pct_error": round(max(abs(r["pct_error"]) for r in compared), 1) if n else None,
        "host_within_15pct_fraction": (round(sum(abs(r["host_pct_error"]) <= 15 for r in host) / len(host), 3)
                                       if host else None),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a handful of rows (Llama: ZeRO-2, ZeRO-3 offload, LoRA, ratio)")
    ap.add_argument("--dpo", action="store_true", help="only the DPO rows (OpenRLHF policy + reference engines; "
                                                      "also part of the full run)")
    ap.add_argument("--moe", action="store_true", help="only the MoE rows (small Mixtral, ZeRO-2 / ZeRO-3 with the "
                                                      "MoE block a leaf module; all but the offload row are part of the full run)")
    ap.add_argument("--summary-json", action="store_true")
    ap.add_argument("--json", help="write every row (with the measured breakdown) to this file")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--reuse", help="compare the measurements saved in this file (by an earlier run's --save) "
                                    "instead of running the engines again: for iterating on the estimator")
    ap.add_argument("--save", help="save the raw measurements to this file")
    args = ap.parse_args(argv)
    from memfit.facts.versions import installed
    from memfit.measure import run_batch
    from memfit.measure.result import MeasureResult

    scenarios = dpo_rows() if args.dpo else moe_rows() if args.moe else rows(args.quick)
    started = time.time()
    if args.reuse:
        saved = json.loads(Path(args.reuse).read_text())
        results = [MeasureResult.from_json(r) for r in saved]
    else:
        results = run_batch(scenarios, steps=args.steps)
        if args.save:
            Path(args.save).write_text(json.dumps([r.to_json() for r in results]))
    out = [compare(s, r) for s, r in zip(scenarios, results)]
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": out, "summary": summary(out), "versions": installed()},
                                              indent=1))
    if args.summary_json:
        print(json.dumps(summary(out) | {"versions": installed()}))
        return 0
    print(table(out))
    print(f"\n{len(out)} runs, 2 ranks (gloo, CPU), {args.steps} steps each, {time.time() - started:.0f} s; "
          f"measured = max over ranks of the device peak; host = sum over ranks per phase, peak phase")
    print(json.dumps(summary(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
