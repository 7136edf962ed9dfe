"""The framework-path groups of bench/accuracy.py: `--profile litgpt` / `--profile torchtune` estimates against
the traces of those frameworks' own training steps, kept by their benches (bench/litgpt_traces.json,
bench/torchtune_traces.json), so no framework venv is needed here. Each group: rows, median and max |error| of the
allocated peak (the trace models no runtime overhead, so the estimate's is left out), the releases traced on.
"""
from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _summary(errors: list[float], versions: dict) -> dict:
    if not errors:
        return {"rows": 0, "median_abs_pct_error": None, "max_abs_pct_error": None, "versions": versions}
    return {"rows": len(errors), "median_abs_pct_error": round(statistics.median(errors), 2),
            "max_abs_pct_error": round(max(errors), 2), "versions": versions}


def _litgpt_bench():
    """bench/litgpt.py by path: the name `litgpt` belongs to LitGPT's own package."""
    spec = importlib.util.spec_from_file_location("litgpt_bench", HERE / "litgpt.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def litgpt_group() -> dict:
    bench = _litgpt_bench()  # its rows, scenarios and comparison

    traces = json.loads(bench.CACHE.read_text())["entries"] if bench.CACHE.exists() else {}
    cached = [(run, traces[bench._key(run)]) for run in bench.ROWS if bench._key(run) in traces]
    errors = [abs(bench.compare(run, traced).error_pct) for run, traced in cached]
    versions = {"litgpt": cached[0][1]["litgpt"], "torch": cached[0][1]["torch"]} if cached else {}
    return _summary(errors, versions)


def torchtune_group() -> dict:
    from memfit.roles.estimate import estimate
    from memfit.trace.torchtune import scenario_of

    path = HERE / "torchtune_traces.json"
    doc = json.loads(path.read_text()) if path.exists() else {"rows": [], "versions": {}}
    errors = []
    for row in doc["rows"]:
        est = estimate(scenario_of(row["model"], row["knobs"])).allocated
        predicted = est.peak.total - est.peak.get("runtime_overhead")
        errors.append(abs(100 * (predicted - row["trace"]) / row["trace"]))
    return _summary(errors, doc["versions"])


def torchtune_distributed_group() -> dict:
    """torchtune's FSDP2 recipes run for real on 2 gloo ranks (bench/torchtune_distributed.py keeps the measurements):
    the allocated step peak per rank, estimate vs measured."""
    spec = importlib.util.spec_from_file_location("torchtune_distributed_bench", HERE / "torchtune_distributed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if not bench.SAVED.exists():
        return _summary([], {})
    rows, versions = bench.saved_rows()
    return _summary([abs(r["error_pct"]) for r in rows], versions)


def litgpt_distributed_group() -> dict:
    """LitGPT's finetune scripts on 2 devices, their own Fabric strategies run for real on 2 gloo ranks
    (bench/litgpt_distributed.py keeps the measurements): the allocated step peak per rank, estimate vs measured."""
    spec = importlib.util.spec_from_file_location("litgpt_distributed_bench", HERE / "litgpt_distributed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if not bench.MEASURED.exists():
        return _summary([], {})
    doc = json.loads(bench.MEASURED.read_text())
    errors = [abs(err) for *_, err in bench.compare(bench.ROWS, doc["rows"])]
    return _summary(errors, doc["versions"])


def _remote_code_group(bench_file: str, source_file: str) -> dict:
    """A hub remote-code family on its own modeling file, traced (the bench keeps the traces): the step's allocated
    peak, estimate vs trace."""
    spec = importlib.util.spec_from_file_location(f"{bench_file}_bench", HERE / f"{bench_file}.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if not bench.OUT.exists():
        return _summary([], {})
    doc = json.loads(bench.OUT.read_text())
    errors = [abs(100 * row[-1]) for row in bench.table(doc)]
    return _summary(errors, {"transformers": doc["transformers"], "torch": doc["torch"],
                             source_file: doc["source"]["commit"][:10]})


def qwen1_group() -> dict:
    """Qwen-1's finetune.py settings on its own hub modeling_qwen.py (bench/qwen1.py)."""
    return _remote_code_group("qwen1", "modeling_qwen.py")


def glm4_group() -> dict:
    """GLM-4-9B-chat's OpenRLHF DPO step on its own hub modeling_chatglm.py (bench/glm4.py)."""
    return _remote_code_group("glm4", "modeling_chatglm.py")


def verl_workers_group() -> dict:
    """verl's own FSDP engine on 2 gloo ranks (bench/verl_workers.py keeps the measurements): the actor update's and
    the reference log-prob pass's allocated peak per rank, estimate (memory/states/verl_fsdp.py) vs measured."""
    spec = importlib.util.spec_from_file_location("verl_workers_bench", HERE / "verl_workers.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if not bench.SAVED.exists():
        return _summary([], {})
    rows, versions = bench.saved_rows()
    return _summary([abs(r["error_pct"]) for r in rows], versions)


def accelerate_fsdp_group() -> dict:
    """HF Trainer's FSDP1 / FSDP2 through accelerate's own preparation on 2 gloo ranks (bench/accelerate_fsdp.py keeps
    the measurements): the allocated step peak per rank, estimate vs measured, on memfit's pinned releases (the rows
    run on other releases, fms-acceleration's, are held by tests/measure/test_accelerate_fsdp.py)."""
    spec = importlib.util.spec_from_file_location("accelerate_fsdp_bench", HERE / "accelerate_fsdp.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if not bench.SAVED.exists():
        return _summary([], {})
    doc = json.loads(bench.SAVED.read_text())
    pinned = {name: m for name, m in doc["rows"].items() if not bench.ROWS[name].get("releases")}
    return _summary([abs(bench.compare(name, m)["error_pct"]) for name, m in pinned.items()], doc["versions"])


def framework_groups() -> dict:
    return {"framework:litgpt": litgpt_group(), "framework:torchtune": torchtune_group(),
            "framework:torchtune-distributed": torchtune_distributed_group(),
            "framework:litgpt-distributed": litgpt_distributed_group(), "framework:qwen1": qwen1_group(),
            "framework:glm4": glm4_group(), "framework:hf-trainer-fsdp": accelerate_fsdp_group(),
            "framework:verl": verl_workers_group()}
