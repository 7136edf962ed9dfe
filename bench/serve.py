"""A bounded load test of `memfit serve` on 127.0.0.1: N estimate requests at once, latency and errors.

    python bench/serve.py                   # 200 concurrent POST /api/estimate (4 x RTX 4090 Qwen2-7B, varied)
    python bench/serve.py --requests 500 --concurrency 50
    python bench/serve.py --slow-plan       # the same while a slow plan (~8 s, 70B on one RTX 4090) is answered

Starts `memfit serve` in its own process on a free port (so the clients do not share its interpreter), waits
for it, sends the requests from a thread pool with urllib (standard library only on the client side), prints
the latency table (p50 / p95 / max, in ms), the throughput and the error count, and stops the server. Each
request varies micro-batch and sequence length so no two are the same. Exit code 1 if any request failed.
--slow-plan sends one slow POST /api/plan_view first (nothing fits, so it also searches 2-64 GPUs): a server whose slow request blocked others would show it in
every estimate's latency (memfit serve runs each request in a worker process).
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

SLOW_PLAN = {"model": "llama3.1-70b", "gpu": "rtx4090", "tuning": "full", "host_ram": "64GiB"}
BASE = {"model": "Qwen/Qwen2-7B-Instruct", "gpu": "rtx4090", "gpus": 4, "profile": "openrlhf", "tuning": "full",
        "zero_stage": 3, "precision": "bf16-mixed", "checkpointing": "full", "attention": "flash"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "memfit.interfaces.cli.main", "serve", "--port", str(port)],
                            stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/openapi.json", timeout=2).read()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise SystemExit("memfit serve exited before it answered")
            time.sleep(0.2)
    proc.terminate()
    raise SystemExit("memfit serve did not answer within 60 s")


def one(url: str, i: int) -> tuple[float, str | None]:
    body = BASE | {"micro_batch": 1 + i % 8, "seq_len": 128 * (1 + i % 16), "offload_optimizer": ("none", "cpu")[i % 2]}
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            doc = json.loads(r.read())
        error = None if doc.get("schema", "").startswith("memfit.estimate") else "not an estimate document"
    except (OSError, ValueError) as e:  # HTTPError, connection refused/reset, timeout, bad JSON
        error = f"{type(e).__name__}: {e}"
    return time.perf_counter() - t0, error


def _slow_plan(port: int) -> tuple[threading.Thread, dict]:
    """One slow plan request in a thread; its time and status land in the dict."""
    out: dict = {}

    def ask():
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/plan_view", json.dumps(SLOW_PLAN).encode(),
                                         {"content-type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                out["status"] = r.status
        except OSError as e:
            out["status"] = f"{type(e).__name__}: {e}"
        out["seconds"] = time.perf_counter() - t0

    thread = threading.Thread(target=ask)
    thread.start()
    time.sleep(0.3)  # the plan is under way before the estimates start
    return thread, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=200, help="requests in flight at once (default: all of them)")
    p.add_argument("--slow-plan", action="store_true", help="one slow plan request in flight meanwhile")
    a = p.parse_args()
    port = free_port()
    proc = start(port)
    url = f"http://127.0.0.1:{port}/api/estimate"
    try:
        for i in range(4):  # warm each worker's catalog and model caches: the table measures steady answers
            one(url, i)
        slow = _slow_plan(port) if a.slow_plan else None
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=a.concurrency) as pool:
            results = list(pool.map(lambda i: one(url, i), range(a.requests)))
        wall = time.perf_counter() - t0
        if slow:
            slow[0].join(120)
    finally:
        proc.terminate()
        proc.wait(10)
    ms = sorted(t * 1000 for t, _ in results)
    errors = [e for _, e in results if e]
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    print(f"memfit serve load test: {a.requests} POST /api/estimate, {a.concurrency} in flight, 127.0.0.1")
    print(f"{'requests':>9} {'errors':>7} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'mean ms':>8} {'req/s':>7}")
    print(f"{len(ms):>9} {len(errors):>7} {statistics.median(ms):>8.0f} {p95:>8.0f} {ms[-1]:>8.0f} "
          f"{statistics.fmean(ms):>8.0f} {len(ms) / wall:>7.1f}")
    if slow:
        print(f"meanwhile one slow POST /api/plan_view: {slow[1].get('seconds', 0):.1f} s, {slow[1].get('status')}")
    for e in sorted(set(errors))[:5]:
        print(f"  error: {e}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
