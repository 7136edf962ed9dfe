"""The caching-allocator replay, rule by rule (memfit/trace/allocator.py R1-R9), on hand-made streams whose
outcome follows from c10's rules; then the recorded step streams it replays (GLM-4-shaped DPO steps)."""
import pytest

from memfit.trace.allocator import DEFAULT_RULES, CachingAllocator, Rules, replay, MiB

R = DEFAULT_RULES


# ---------------------------------------------------------------------------------------------- R1 rounding
@pytest.mark.parametrize("n, block", [(1, 512), (512, 512), (513, 1024), (4000, 4096)])
def test_requests_round_up_to_512_bytes(n, block):
    a = CachingAllocator()
    assert a.block_size(a.malloc(n)) == block
    assert a.allocated == block


def test_zero_bytes_take_no_block():
    a = CachingAllocator()
    a.free(a.malloc(0))
    assert (a.allocated, a.reserved) == (0, 0)


# ---------------------------------------------------------------------------------------------- R2/R3 pools, segments
@pytest.mark.parametrize("n, segment", [
    (1 * MiB, 2 * MiB),  # the largest small request: a 2 MiB small segment
    (1 * MiB + 1, 20 * MiB),  # the smallest large request: a 20 MiB segment
    (10 * MiB - 512, 20 * MiB),  # below kMinLargeAlloc
    (10 * MiB, 10 * MiB),  # from kMinLargeAlloc on: the request rounded to 2 MiB
    (10 * MiB + 1, 12 * MiB),
])
def test_segment_sizes(n, segment):
    a = CachingAllocator()
    a.malloc(n)
    assert a.reserved == segment


def test_small_requests_never_come_from_the_large_pool():
    a = CachingAllocator()
    a.malloc(5 * MiB)  # a 20 MiB large segment with 15 MiB free
    a.malloc(4096)
    assert a.reserved == 22 * MiB and a.segments_made == 2


def test_small_segment_serves_many_small_requests():
    a = CachingAllocator()
    for _ in range(4):
        a.malloc(512 * 1024)
    assert a.reserved == 2 * MiB  # four requests of 512 KiB fill one 2 MiB segment exactly
    a.malloc(512)
    assert a.reserved == 4 * MiB


# ---------------------------------------------------------------------------------------------- R4 best fit
def test_best_fit_takes_the_smallest_block_that_fits():
    a = CachingAllocator()
    big, small = a.malloc(30 * MiB), a.malloc(24 * MiB)
    a.free(big), a.free(small)
    assert a.malloc(22 * MiB) == small
    assert a.reserved == 54 * MiB  # no new segment


def test_best_fit_breaks_ties_by_address():
    a = CachingAllocator()
    first, second = a.malloc(12 * MiB), a.malloc(12 * MiB)
    a.free(second), a.free(first)
    assert a.malloc(12 * MiB) == first


def test_no_free_block_big_enough_makes_a_segment():
    a = CachingAllocator()
    a.free(a.malloc(12 * MiB))
    a.malloc(14 * MiB)
    assert a.reserved == 26 * MiB and a.cached_free == 12 * MiB


# ---------------------------------------------------------------------------------------------- R5 split
def test_large_block_splits_only_above_one_mib_of_remainder():
    a = CachingAllocator()
    a.malloc(5 * MiB)  # splits the 20 MiB segment: 15 MiB stay free
    assert a.allocated == 5 * MiB
    b = a.malloc(14 * MiB + 512)  # remainder 1 MiB - 512 B: not split, the whole 15 MiB is handed out
    assert a.block_size(b) == 15 * MiB and a.allocated == 20 * MiB and a.reserved == 20 * MiB


def test_large_block_splits_with_more_than_one_mib_left():
    a = CachingAllocator()
    a.malloc(5 * MiB)
    b = a.malloc(14 * MiB - 512)  # remainder 1 MiB + 512 B
    assert a.block_size(b) == 14 * MiB - 512 and a.cached_free == 1 * MiB + 512


def test_small_block_splits_down_to_512_bytes():
    a = CachingAllocator()
    x = a.malloc(2 * MiB - 1024)  # > 1 MiB: large pool; use a small one instead
    a.free(x)
    s = a.malloc(1 * MiB - 512)  # small segment of 2 MiB: remainder 1 MiB + 512 >= 512, split
    assert a.block_size(s) == 1 * MiB - 512
    t = a.malloc(1 * MiB)
    u = a.malloc(512)  # the last 512 B of the small segment
    assert a.block_size(t) == 1 * MiB and a.block_size(u) == 512
    assert a.reserved == 20 * MiB + 2 * MiB  # the freed large segment is not used for small requests


# ---------------------------------------------------------------------------------------------- R6 merge
def test_freed_neighbours_merge():
    a = CachingAllocator()
    x, y = a.malloc(4 * MiB), a.malloc(4 * MiB)
    a.malloc(12 * MiB)  # fills the rest of the 20 MiB segment exactly
    a.free(x), a.free(y)
    assert a.malloc(7 * MiB) == x  # only the merged 8 MiB block can hold it
    assert a.reserved == 20 * MiB


def test_blocks_of_different_segments_never_merge():
    a = CachingAllocator()
    x, y = a.malloc(12 * MiB), a.malloc(12 * MiB)  # two segments, made one after the other
    a.free(x), a.free(y)
    a.malloc(20 * MiB)
    assert a.reserved == 44 * MiB


# ---------------------------------------------------------------------------------------------- R7-R9 growth, retry, OOM
def test_cached_segments_are_released_and_the_request_retried():
    a = CachingAllocator(capacity=40 * MiB)
    a.free(a.malloc(24 * MiB))
    assert a.reserved == 24 * MiB  # kept cached: nothing goes back to the driver on free
    assert a.malloc(30 * MiB) is not None
    assert a.releases == 1 and a.reserved == 30 * MiB


def test_a_segment_with_a_live_block_is_not_released():
    a = CachingAllocator(capacity=40 * MiB)
    x, _y = a.malloc(4 * MiB), a.malloc(4 * MiB)
    a.free(x)
    assert a.malloc(22 * MiB) is None  # 16 MiB cached, but in a segment that still holds y
    assert (a.reserved, a.allocated) == (20 * MiB, 4 * MiB)


def test_replay_reports_the_oom_point_and_step_levels():
    events = [(1, "x", 4 * MiB), (1, "y", 4 * MiB), (-1, "x"), ("mark", 0), (1, "z", 22 * MiB)]
    r = replay(events, capacity=40 * MiB)
    assert r.oom is not None and r.oom.event == 4 and r.oom.reserved_unallocated == 16 * MiB
    assert r.steps[0].peak_allocated == 8 * MiB and r.steps[0].reserved_end == 20 * MiB
    assert replay(events, capacity=42 * MiB).oom is None


def test_unknown_frees_are_ignored():
    r = replay([(-1, "never"), (1, "a", 512), (-1, "a"), (-1, "a")])
    assert r.peak_allocated == 512 and r.oom is None


# ---------------------------------------------------------------------------------------------- max_split_size
def test_max_split_size_rules():
    rules = Rules(max_split_size=64 * MiB)
    assert not rules.may_take(10 * MiB, 64 * MiB)  # a request below it never takes an oversize block
    assert rules.may_take(70 * MiB, 89 * MiB) and not rules.may_take(70 * MiB, 90 * MiB)  # < request + 20 MiB
    assert not rules.should_split(False, 200 * MiB, 100 * MiB)  # oversize requests are not split
    assert R.should_split(False, 200 * MiB, 100 * MiB)


# ---------------------------------------------------------------------------------------------- GLM-4 DPO streams
# OpenRLHF DPO of GLM-4-9B under ZeRO-3 with checkpointing, two decoder layers of the real shapes (the stream of
# one layer repeats per layer), traced at 512/1024/2048 tokens and checked at 1536; sample lengths as in
# allocator_study (log-normal, median 30% of the maximum)
MAX_LEN, STEPS, SEEDS = 2048, 60, (0, 1, 2, 3)


@pytest.fixture(scope="module")
def glm4():
    pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[trace])")
    from dataclasses import replace

    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware
    from memfit.trace.allocator_study import length_model

    model = replace(find_model("THUDM/glm-4-9b-chat"), num_layers=2)
    knobs = {"method": "dpo", "zero_stage": 3, "micro_batch": 1, "seq_len": MAX_LEN, "checkpointing": "full"}
    hw = Hardware(find_gpu("a100-80gb"), gpus_per_node=8)
    return {attn: length_model(build_scenario(model, hw, knobs | {"attention": attn}, "openrlhf"))
            for attn in ("eager", "flash")}


def test_step_sizes_are_exact_polynomials_of_the_length(glm4):
    # length_model already checked the fit at a fourth length; eager's scores grow with s^2, flash has none
    assert any(c[2] for c in glm4["eager"].coefficients)
    assert not any(c[2] for c in glm4["flash"].coefficients)


def test_steps_of_one_length_keep_a_steady_reserve(glm4):
    from memfit.trace.allocator_study import simulate

    run = simulate(glm4["eager"], [MAX_LEN] * 10)
    assert len({s.reserved_end for s in run.steps}) == 1 and run.releases == 0
    assert run.peak_reserved > run.peak_allocated  # the cache holds more than the live peak even so


@pytest.mark.parametrize("attn", ["eager", "flash"])
def test_varying_lengths_grow_the_cache_unevenly(glm4, attn):
    from memfit.trace.allocator_study import sample_lengths, simulate

    uniform = simulate(glm4[attn], [MAX_LEN] * 3)
    runs = [simulate(glm4[attn], sample_lengths(STEPS, MAX_LEN, seed=s, median=MAX_LEN * 3 // 10)) for s in SEEDS]
    for run in runs:  # each rank meets a step at (or within 1% of) the maximum: the same allocated peak
        assert abs(run.peak_allocated - uniform.peak_allocated) <= 0.01 * uniform.peak_allocated
        assert run.steps[-1].reserved_end >= run.steps[0].reserved_end  # nothing goes back to the driver
    reserved = [run.peak_reserved for run in runs]
    assert max(reserved) > 1.3 * uniform.peak_reserved  # the worst rank reserves far beyond a uniform run
    assert max(reserved) > 1.3 * min(reserved)  # and ranks differ by their samples' order
    assert sum(run.steps[-1].reserved_end > run.steps[0].reserved_end for run in runs) >= len(runs) - 1  # growth


def test_longest_fitting_step_fits_and_the_next_does_not(glm4):
    from memfit.trace.allocator_study import longest_fitting, simulate

    capacity = simulate(glm4["eager"], [MAX_LEN // 2]).peak_reserved + 64 * MiB
    n = longest_fitting(glm4["eager"], [], 0, capacity, MAX_LEN)
    assert MAX_LEN // 2 <= n < MAX_LEN
    assert simulate(glm4["eager"], [n], capacity=capacity).oom is None
    assert simulate(glm4["eager"], [n + 64], capacity=capacity).oom is not None


def test_the_shipped_slack_table_is_what_the_replay_derives():
    pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[trace])")
    import tomllib

    from memfit.trace.allocator_facts import OUT, SPECS, derive_row

    table = tomllib.loads(OUT.read_text())
    spec = next(s for s in SPECS if s.layers)  # the small row: two GLM-4 layers, traced in seconds
    assert table[spec.key] == derive_row(spec)
    from memfit.facts.versions import pinned

    # the rules are read from c10 of the pinned torch: a torch bump fails here until they are re-read
    assert table["torch"] == pinned()["torch"] and table["transformers"] == pinned()["transformers"]
    for key in (s.key for s in SPECS):  # the cache never holds less than the live peak
        assert 0 <= table[key]["uniform"] <= table[key]["varying_max"]
