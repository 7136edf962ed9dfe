"""memfit plan (memfit/planner/): only fitting configurations, the global batch kept, `allow` and the frameworks'
constraints respected, the user reports' fixes found, each change measured."""

from dataclasses import replace

import pytest

from memfit.errors import MemfitError
from memfit.roles.estimate import estimate
from memfit.planner.plan import Options, baseline, choose_for_fit, closest_miss, plan
from memfit.planner.step_time import step_time
from memfit.planner.throughput import tie_band

QWEN = dict(model="Qwen/Qwen2-7B-Instruct", gpu="rtx4090", gpus=4, profile="openrlhf", tuning="full", zero_stage=3,
            micro_batch=4, seq_len=128, checkpointing="full", attention="flash")
LLAMA = dict(model="meta-llama/Llama-3.1-8B-Instruct", gpu="rtx4090", gpus=7, profile="llamafactory",
             tuning="lora", lora_rank=8, seq_len=2048, precision="bf16-pure", micro_batch=4)


def global_batch(s) -> int:
    return s.micro_batch * s.grad_accum * s.world_size


def test_the_qwen2_7b_zero3_oom_gets_a_fitting_plan_with_adam_offload(scenario):
    base = scenario(**QWEN)
    assert estimate(base).verdict == "oom"
    rows = plan(base, set(), None)
    assert rows
    assert any(r.scenario.offload_optimizer == "cpu" for r in rows[:3])
    offload = next(c for c in rows[0].changes if c.knob == "offload")
    assert offload.after == "cpu" and offload.needed_to_fit
    assert offload.device_saving_bytes > 20 * 2**30  # fp32 master + Adam moved to the host
    assert offload.host_saving_bytes < 0  # ... where they now live


def test_with_lora_allowed_the_qwen2_7b_plan_leads_with_lora(scenario):
    rows = plan(scenario(**QWEN), {"lora"}, None)
    assert rows[0].scenario.tuning == "lora"
    assert rows[0].tokens_per_second > max(r.tokens_per_second for r in rows if r.scenario.tuning == "full")


def test_every_row_fits_device_and_host_when_re_estimated(scenario):
    for base, allow in ((scenario(**QWEN), {"lora", "qlora"}), (scenario(**LLAMA), set()),
                        (scenario(**QWEN, host_ram=200 * 2**30), set())):
        rows = plan(base, allow, None)
        assert rows
        for r in rows:
            e = estimate(r.scenario)
            assert e.verdict in ("fits", "tight") and r.verdict == e.verdict
            assert r.headroom_bytes == e.margin_bytes >= 0
            assert r.device_peak_bytes == e.device_total.peak.total
            if e.host_margin_bytes is not None:
                assert e.host_margin_bytes >= 0


def test_host_ram_limits_the_plan(scenario):
    """Adam offload needs ~250 GiB of host RAM for 4 ranks of Qwen2-7B: with 64 GiB it must not be offered."""
    rows = plan(scenario(**QWEN, host_ram=64 * 2**30), {"lora"}, None)
    assert rows
    assert all(r.scenario.engine != "deepspeed" or r.scenario.offload_optimizer == "none" for r in rows)
    assert all(r.host_peak_bytes <= 64 * 2**30 for r in rows)


def test_the_global_batch_is_kept(scenario):
    base = scenario(**LLAMA)
    for rows, want in ((plan(base, set(), None), global_batch(base)), (plan(base, set(), 112), 112)):
        assert rows
        for r in rows:
            assert global_batch(r.scenario) == want


def test_a_global_batch_the_gpus_do_not_divide_is_refused(scenario):
    with pytest.raises(MemfitError, match="multiple of the 7 GPUs"):
        plan(scenario(**LLAMA), set(), 100)


def test_tuning_and_optimizer_changes_only_when_allowed(scenario):
    base = scenario(**QWEN)
    for r in plan(base, set(), None):
        assert r.scenario.tuning == "full" and r.scenario.optimizer == base.optimizer
    only_lora = plan(base, {"lora"}, None)
    assert {r.scenario.tuning for r in only_lora} <= {"full", "lora"}
    assert any(r.scenario.tuning == "lora" for r in only_lora)


def test_unknown_allow_words_are_refused(scenario):
    with pytest.raises(MemfitError, match="--allow"):
        plan(scenario(**QWEN), {"full-finetune-please"}, None)


def test_the_frameworks_constraints_hold_in_every_row(scenario):
    bases = [scenario(**QWEN), scenario(**QWEN, host_ram=200 * 2**30),
             scenario(model="meta-llama/Llama-3.1-8B-Instruct", gpu="a100-80gb", gpus=2, profile="hf-trainer",
                      tuning="full", micro_batch=8, seq_len=4096)]
    for base in bases:
        for r in plan(base, {"lora", "qlora", "8bit"}, None, top_k=10):
            s = r.scenario
            if s.engine == "deepspeed":
                assert s.ratio == 1.0 or (s.zero_stage == 3 and s.offload_optimizer != "none")
                assert s.offload_param == "none" or s.zero_stage == 3
                assert s.offload_optimizer == "none" or s.zero_stage > 0
                assert s.optimizer == base.optimizer  # ZeRO runs DeepSpeed's own Adam
            if base.profile == "openrlhf":
                assert s.engine == "deepspeed"  # OpenRLHF has no DDP or FSDP mode
            if s.padding == "padding_free":
                assert s.attention == "flash"


def test_no_flash_attention_below_compute_capability_8(scenario):
    base = scenario(model="Qwen/Qwen2-0.5B-Instruct", gpu="v100-32gb", gpus=1, profile="hf-trainer",
                    tuning="full", precision="fp16-mixed", micro_batch=8, seq_len=2048)
    rows = plan(base, set(), None)
    assert rows
    assert all(r.scenario.attention != "flash" for r in rows)


def test_ratio_comes_with_a_sub_group_size_that_makes_it_act(scenario):
    """DeepSpeed keeps sub-group i on the GPU iff i < int((1 - ratio) * groups): a ratio row must split the
    partition so that at least one sub-group stays on the GPU."""
    rows = plan(scenario(**{**QWEN, "profile": "hf-trainer"}), set(), None, top_k=10)
    ratio_rows = [r for r in rows if r.scenario.engine == "deepspeed" and r.scenario.ratio < 1]
    assert ratio_rows
    for r in ratio_rows:
        ds = r.scenario
        part = -(-estimate(r.scenario).trainable_params // r.scenario.world_size)
        groups = -(-part // ds.sub_group_size)
        assert int((1 - ds.ratio) * groups) >= 1


def test_openrlhf_plans_mark_knobs_its_command_line_lacks_as_code_edits(scenario):
    # OpenRLHF writes its DeepSpeed offload block in code (get_train_ds_config): no ratio, sub-group size or
    # pin_memory flag. The plan may change them only as marked code edits, and not at all without code edits.
    # A node with a little less RAM than the offloaded Adam needs: only such an edit (part of Adam kept on the
    # GPU, or pageable buffers) makes the run fit. (With RAM to spare, ratio's speed-up is inside the tie band
    # and the plan leaves the code alone.)
    offloaded = baseline(scenario(**QWEN, offload_optimizer="cpu")).host_peak_bytes
    short = scenario(**QWEN, host_ram=int(0.92 * offloaded))
    rows = plan(short, set(), None, top_k=10)
    assert rows
    for r in rows:
        edits = [c for c in r.changes if c.code_edit]
        assert edits and any(c.needed_to_fit for c in edits) and r.host_peak_bytes <= 0.92 * offloaded
    for c in (c for r in rows for c in r.changes if c.knob in ("ratio", "pin_memory")):
        assert c.code_edit.function == "get_train_ds_config"
        assert c.code_edit.file == "openrlhf/utils/deepspeed/deepspeed_utils.py"
        assert any(target.startswith('zero_opt_dict["offload_optimizer"]') for target, _ in c.code_edit.assignments)
    assert all(c.code_edit is None for r in rows for c in r.changes if c.knob not in ("ratio", "pin_memory"))
    assert plan(short, set(), None, top_k=10, options=Options(code_edits=False)) == []
    plain = plan(scenario(**QWEN), set(), None, top_k=10, options=Options(code_edits=False))
    assert plain and all(r.scenario.ratio == 1.0 and r.scenario.pin_memory is True for r in plain)


QWEN72 = dict(model="Qwen/Qwen2.5-72B-Instruct", gpu="a100-80gb", gpus=8, profile="openrlhf", zero_stage=3,
              offload_optimizer="cpu", checkpointing="full", attention="flash", micro_batch=1, seq_len=2048,
              host_ram=1_400_000_000_000)


def test_qwen25_72b_pinned_start_fits_only_through_a_code_edit(scenario):
    """report-qwen25-72b-offload-pinned: a fresh start on 1 node x 8 A100-80GB with 1.4 TB runs out of host
    RAM with OpenRLHF's hard-coded pin_memory; only an edit of get_train_ds_config makes it fit."""
    base = scenario(pin_memory=True, **QWEN72)
    fresh = Options(resume=False)
    assert baseline(base, options=fresh).verdict == "host_oom"
    assert plan(base, set(), None, options=Options(code_edits=False, resume=False)) == []
    rows = plan(base, set(), None, options=fresh)
    assert rows
    for r in rows:
        assert r.host_peak_bytes <= 1_400_000_000_000
        edits = [c for c in r.changes if c.code_edit]
        assert edits and all(c.knob in ("pin_memory", "ratio") for c in edits)
        assert any(c.needed_to_fit for c in edits)
    pin_false = baseline(base.with_changes(pin_memory=False), options=fresh)
    assert pin_false.verdict in ("fits", "tight")  # the reported fix fits a fresh start ...
    assert rows[0].tokens_per_second >= pin_false.tokens_per_second  # ... and the first row is at least as fast


def test_a_resume_is_judged_unless_the_run_never_resumes(scenario):
    """Each rank torch.loads its optimizer partition on resume (docs/knobs.md A.8): with pin_memory false the
    72B run fits a fresh start but not a resume on 1.4 TB; only ratio < 1 (a code edit) fixes the resume."""
    base = scenario(pin_memory=False, **QWEN72)
    fresh = baseline(base, options=Options(resume=False))
    assert fresh.verdict in ("fits", "tight")
    resumed = baseline(base)
    assert resumed.verdict == "host_oom"
    assert resumed.host_peak_bytes - fresh.host_peak_bytes > 100 * 2**30
    assert plan(base, set(), None, options=Options(code_edits=False)) == []
    rows = plan(base, set(), None)
    assert rows and all(r.scenario.ratio < 1 for r in rows)


def test_changes_name_the_start_and_the_plan(scenario):
    base = scenario(**QWEN)
    start = baseline(base)
    assert start.verdict == "oom" and start.changes == ()
    for r in plan(base, {"lora"}, None):
        assert r.changes  # the start does not fit, so every row changes something
        for c in r.changes:
            assert c.before != c.after
            assert c.measured in ("alone", "in_plan")
        needed = [c for c in r.changes if c.needed_to_fit]
        assert needed  # something in each row is what makes it fit


def test_rows_are_fastest_first_and_distinct(scenario):
    rows = plan(scenario(**QWEN), {"lora", "qlora"}, None)
    speeds = [r.tokens_per_second for r in rows]
    assert speeds == sorted(speeds, reverse=True)
    keys = [frozenset((c.knob, c.after) for c in r.changes) for r in rows]
    assert len(set(keys)) == len(keys)
    for r in rows:
        assert r.tokens_per_second == pytest.approx(step_time(r.scenario).tokens_per_second)


def test_the_llama_lora_ddp_oom_gets_a_plan_at_least_as_fast_as_the_reported_fixes(scenario):
    base = scenario(**LLAMA)
    assert estimate(base).verdict == "oom"
    rows = plan(base, set(), None)
    micro_2 = base.with_changes(micro_batch=2, grad_accum=2)
    zero_3 = scenario(**LLAMA, zero_stage=3)
    fixes = [step_time(s).tokens_per_second for s in (micro_2, zero_3)]
    assert rows[0].tokens_per_second >= max(fixes)


def test_choose_for_fit_prefers_fewer_changes_when_the_speeds_tie(scenario):
    """Ties are against the fastest row (plan ranks a tie's simplest row first, so that is not rows[0])."""
    rows = plan(scenario(**QWEN), {"lora", "qlora"}, None)
    fast, simple = rows[0], min(rows, key=lambda r: len(r.changes))
    assert len(simple.changes) < len(fast.changes)
    tied = replace(simple, tokens_per_second=fast.tokens_per_second * (1 - tie_band() / 2))
    apart = replace(simple, tokens_per_second=fast.tokens_per_second * (1 - tie_band() * 1.5))
    assert choose_for_fit([fast, tied]) is tied and choose_for_fit([tied, fast]) is tied
    assert choose_for_fit([apart, fast]) is fast and choose_for_fit([fast, apart]) is fast
    assert choose_for_fit([]) is None


def test_when_nothing_fits_the_closest_miss_is_reported(scenario):
    base = scenario(model="Qwen/Qwen2.5-72B-Instruct", gpu="rtx4090", gpus=2, profile="openrlhf", tuning="full",
                    zero_stage=3, micro_batch=1, seq_len=2048)
    assert plan(base, set(), None) == []
    miss = closest_miss(base)
    assert miss is not None and miss.verdict in ("oom", "host_oom")
