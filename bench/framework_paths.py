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


def _bench(bench_file: str):
    """A bench module of this folder, loaded by its file name (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"{Path(bench_file).stem}_bench", HERE / bench_file)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    return bench


def _summary(errors: list[float], versions: dict) -> dict:
    if not errors:
        return {"rows": 0, "median_abs_pct_error": None, "max_abs_pct_error": None, "versions": versions}
    return {"rows": len(errors), "median_abs_pct_error": round(statistics.median(errors), 2),
            "max_abs_pct_error": round(max(errors), 2), "versions": versions}


def litgpt_group() -> dict:
    bench = _bench("litgpt.py")  # its rows, scenarios and comparison (by path: `litgpt` is LitGPT's package)

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


def _saved_rows_group(bench_file: str) -> dict:
    """A bench that keeps its 2-rank measurements (SAVED) and compares them with saved_rows(): |error| per row."""
    bench = _bench(bench_file)
    if not bench.SAVED.exists():
        return _summary([], {})
    rows, versions = bench.saved_rows()
    return _summary([abs(r["error_pct"]) for r in rows], versions)


def torchtune_distributed_group() -> dict:
    """torchtune's FSDP2 recipes run for real on 2 gloo ranks (bench/torchtune_distributed.py keeps the measurements):
    the allocated step peak per rank, estimate vs measured."""
    return _saved_rows_group("torchtune_distributed.py")


def litgpt_distributed_group() -> dict:
    """LitGPT's finetune scripts on 2 devices, their own Fabric strategies run for real on 2 gloo ranks
    (bench/litgpt_distributed.py keeps the measurements): the allocated step peak per rank, estimate vs measured."""
    bench = _bench("litgpt_distributed.py")
    if not bench.MEASURED.exists():
        return _summary([], {})
    doc = json.loads(bench.MEASURED.read_text())
    errors = [abs(err) for *_, err in bench.compare(bench.ROWS, doc["rows"])]
    return _summary(errors, doc["versions"])


def _remote_code_group(bench_file: str, source_file: str) -> dict:
    """A hub remote-code family on its own modeling file, traced (the bench keeps the traces): the step's allocated
    peak, estimate vs trace."""
    bench = _bench(f"{bench_file}.py")
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
    return _saved_rows_group("verl_workers.py")


def accelerate_fsdp_group() -> dict:
    """HF Trainer's FSDP1 / FSDP2 through accelerate's own preparation on 2 gloo ranks (bench/accelerate_fsdp.py keeps
    the measurements): the allocated step peak per rank, estimate vs measured, on memfit's pinned releases (the rows
    run on other releases, fms-acceleration's, are held by tests/measure/test_accelerate_fsdp.py)."""
    bench = _bench("accelerate_fsdp.py")
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
