"""Issue 13: on 2 gloo ranks (a real DDP run over torch.distributed), one rank fed long samples is reported as
imbalance that follows the ranks' tokens; one rank that leaks as imbalance that does not, with growth on it."""
import subprocess
import sys
from pathlib import Path

import pytest

from net_support import free_port

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gloo")
    for case in ("long", "leak"):
        # a port found free can be taken by another test's ranks before these bind it (two pytest workers start
        # process groups at once): a rank then aborts in gloo's rendezvous; a second try gets another port
        for attempt in range(2):
            for old in folder.glob(f"{case}.jsonl*"):
                old.unlink()
            done = subprocess.run([sys.executable, str(HERE / "gloo_loop.py"), str(folder / f"{case}.jsonl"), case,
                                   str(free_port())], capture_output=True, text=True, timeout=300)
            if done.returncode == 0:
                break
        assert done.returncode == 0, done.stderr[-2000:]
    return folder


def _imbalance(doc):
    found = [f for f in doc["findings"] if f["kind"] == "imbalance"]
    assert len(found) == 1, doc["findings"]
    return found[0]


def test_long_samples_on_one_gloo_rank(runs, watch_json):
    doc = watch_json(runs / "long.jsonl")  # MemoryMonitor named the files long.rank{0,1}.jsonl from the group
    assert set(doc["ranks"]) == {"0", "1"} and doc["ranks"]["1"]["mean_tokens"] == 4 * doc["ranks"]["0"]["mean_tokens"]
    imb = _imbalance(doc)
    assert imb["max_rank"] == 1 and imb["follows_tokens"] is True and not doc["leak"]["detected"]


def test_a_leaking_gloo_rank(runs, watch_json):
    doc = watch_json(runs / "leak.jsonl")
    imb = _imbalance(doc)
    assert imb["max_rank"] == 1 and imb["follows_tokens"] is False
    assert doc["leak"]["detected"] and doc["leak"]["rank"] == 1
    assert [f["rank"] for f in doc["findings"] if f["kind"] == "growth"] == [1]
