"""One validation pass for a run (issue 14): absurd sizes, non-integers, contradictory engines and knobs the run
ignores are a one-line error naming the flag, or a warning under "assumed"; a sequence past the model's
positions is a warning. Never a silent drop."""
import json
from dataclasses import replace
from pathlib import Path

import pytest

from memfit.errors import MemfitError
from memfit.facts.catalog import find_gpu, find_model, models
from memfit.facts.knobs import hardware, knobs
from memfit.facts.profiles import build_scenario
from memfit.facts.scenario import Hardware
from memfit.interfaces.cli.main import main
from memfit.roles.estimate import estimate
from shared_cases import CASES as SHARED_CASES
from shared_support import shared

ROOT = Path(__file__).resolve().parents[1]
BASE = ["estimate", "qwen2-7b", "--gpu", "rtx4090"]


def cli(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_error(code, err, *needles):
    assert code == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]


def scenario(knobs_given: dict, gpus: int = 1, model: str = "qwen2-7b", **kw):
    return build_scenario(find_model(model), Hardware(gpu=find_gpu("a100-80gb"), gpus_per_node=gpus), knobs_given, **kw)


# ------------------------------------------------------------------------------------------------ absurd sizes
def test_seq_1e12_is_refused_naming_the_flag_and_the_range(capsys):
    """Issue 14: `--seq 1e12` was answered (5e16 GiB)."""
    one_line_error(*cli(BASE + ["--seq", "1e12"], capsys)[::2], "--seq-len/--seq", "[1, 16,777,216]")


def test_every_whole_number_knob_has_an_upper_bound():
    for k in (*knobs().values(), *hardware().values()):
        if k.type == "int":
            assert k.max is not None, k.name
            with pytest.raises(MemfitError, match=k.label.split("/")[0]):
                k.check(int(k.max) + 1)
            k.check(int(k.max))


def _real_values() -> dict[str, list[int]]:
    """Every count the published and user-reported cases state, by the knob it sets."""
    keys = {"micro_batch_size": "micro_batch", "seq_len": "seq_len", "grad_accum": "grad_accum",
            "lora_rank": "lora_rank", "lora_alpha": "lora_alpha", "num_gpus": "gpus_per_node"}
    out: dict[str, list[int]] = {k: [] for k in keys.values()}
    for name in ("published.jsonl", "user-reports.jsonl"):
        for line in shared(SHARED_CASES / name).read_text().splitlines():
            case = json.loads(line) if line.strip() else {}
            for key, knob in keys.items():
                if isinstance(case.get(key), int):
                    out[knob].append(case[key])
    return out


def test_bounds_refuse_no_real_run():
    table = {**knobs(), **hardware()}
    values = _real_values()
    assert sum(map(len, values.values())) > 500
    for name, seen in values.items():
        for v in seen:
            table[name].check(v)
    from memfit.interfaces.formats import read_config

    files = [p for p in (ROOT / "tests" / "formats" / "examples").rglob("*") if p.is_file()]
    checked = 0
    for path in files:
        try:
            found = read_config(str(path), gpus=8).knobs
        except MemfitError:  # a file the examples keep as a refused one
            continue
        for name, v in found.items():
            if table[name].type == "int" and v is not None:
                table[name].check(v)
                checked += 1
    assert checked > 50


# ------------------------------------------------------------------------------------------------ non-integers
@pytest.mark.parametrize("argv, flag", [(["--micro-batch", "2.5"], "--micro-batch"), (["--gpus", "1.5"], "--gpus"),
                                        (["--lora-rank", "8.5", "--tuning", "lora"], "--lora-rank")])
def test_a_fraction_where_a_count_is_meant_is_refused(argv, flag, capsys):
    """Issue 14: `--micro-batch 2.5` was accepted."""
    one_line_error(*cli(BASE + argv, capsys)[::2], flag, "whole number")


@pytest.mark.parametrize("name, text", [
    ("ds.json", '{"train_micro_batch_size_per_gpu": 2.5, "zero_optimization": {"stage": 2}}'),
    ("train.yaml", "model_name_or_path: Qwen/Qwen2-7B-Instruct\nstage: sft\nfinetuning_type: lora\n"
                   "per_device_train_batch_size: 2.5\ncutoff_len: 1024\n"),
])
def test_a_fraction_in_a_framework_file_is_refused(tmp_path, name, text, capsys):
    path = tmp_path / name
    path.write_text(text)
    one_line_error(*cli(BASE + ["--gpus", "2", "--from", str(path)], capsys)[::2], "2.5")


def test_build_scenario_refuses_a_fraction_from_any_caller():
    with pytest.raises(MemfitError, match="--micro-batch expects a whole number, got 2.5"):
        scenario({"micro_batch": 2.5})


# ------------------------------------------------------------------------------------------------ contradictions
def test_a_zero_stage_and_an_fsdp_strategy_are_refused_from_a_file_too():
    """Issue 14: `--zero 3 --fsdp full_shard` quietly used DeepSpeed (the CLI case is in test_cli_errors.py)."""
    with pytest.raises(MemfitError, match="name different engines"):
        scenario({"zero_stage": 3, "fsdp_strategy": "full_shard"}, gpus=2)


# a run on which each `when` / `needs` condition of the knob table does not hold
NOT_MET = {"deepspeed": {"fsdp_strategy": "full_shard"}, "fsdp": {"zero_stage": 2}, "adapters": {"tuning": "full"},
           "qlora": {"tuning": "lora"}, "freeze": {"tuning": "full"}, "virtual_tokens": {"tuning": "lora"},
           "every_n": {"checkpointing": "full"}, "several": {"method": "sft"}, "offload": {"zero_stage": 2},
           "zero3": {"zero_stage": 2}, "ranked": {"tuning": "oft"}, "plain_mixed": {"precision": "bf16-pure"},
           "nf4": {"tuning": "qlora", "quant_bits": 8}, "full": {"tuning": "lora"}}


def _set_value(k):
    """A valid value other than the knob's default: what a user would only write on purpose."""
    if k.type == "bool":
        return not k.default
    if k.choices:
        return next(c for c in k.choices if c not in (k.default, "none"))
    if k.type == "int":
        return (k.default or k.min or 0) + 1
    if k.type == "float":
        return (k.min + k.max) / 2 if k.max is not None else (k.default or 0) + 0.5
    if k.type == "list":
        return ("embed_tokens",) if k.name == "modules_to_save" else ("q_proj",)
    if k.type == "pairs":
        return (("actor", 1),)
    return "qwen2-7b"


INERT = [(k.name, cond) for k in knobs().values() for cond in (k.when, k.needs) if cond]


def test_every_condition_of_the_table_is_covered():
    assert {cond for _, cond in INERT} <= set(NOT_MET)


@pytest.mark.parametrize("name, condition", INERT)
def test_a_typed_knob_the_run_ignores_is_an_error_naming_it(name, condition):
    k = knobs()[name]
    given = {**NOT_MET[condition], name: _set_value(k)}
    with pytest.raises(MemfitError) as e:
        scenario(given, gpus=2, typed=set(given))
    assert k.flag in str(e.value) or name in str(e.value), str(e.value)


@pytest.mark.parametrize("name, condition", [(n, c) for n, c in INERT if c != "several"])
def test_the_same_knob_from_a_file_is_listed_as_ignored(name, condition):
    """Framework files carry inert keys (DeepSpeed sections, LoRA keys of a full run): a warning, not a refusal."""
    k = knobs()[name]
    given = {**NOT_MET[condition], name: _set_value(k)}
    try:
        s = scenario(given, gpus=2)
    except MemfitError as e:  # a rule of its own already refuses this pair (engines, modules_to_save): fine
        assert k.flag in str(e) or k.label in str(e)
        return
    assert any(a.startswith(f"ignored {k.flag}=") for a in s.assumed), s.assumed


def test_a_knob_that_acts_or_sits_at_its_default_is_not_flagged():
    s = scenario({"tuning": "lora", "lora_rank": 64}, typed={"tuning", "lora_rank"})
    assert not any(a.startswith("ignored") for a in s.assumed)
    # OpenRLHF writes pin_memory=True with no offload in every config: nothing a user meant, nothing to say
    s = scenario({"zero_stage": 2, "pin_memory": True}, gpus=2)
    assert not any(a.startswith("ignored") for a in s.assumed)


@pytest.mark.parametrize("argv, flag", [
    (["--lora-rank", "64", "--tuning", "full"], "--lora-rank"),
    (["--gpus", "2", "--fsdp", "full_shard", "--offload-optimizer", "cpu"], "--offload-optimizer"),
    (["--gpus", "2", "--zero", "2", "--fsdp-offload"], "--fsdp-cpu-offload"),
    (["--gpus", "2", "--zero", "2", "--no-pin-memory"], "--pin-memory"),
    (["--gpus", "2", "--zero", "2", "--sub-group-size", "1000"], "--sub-group-size"),
])
def test_the_command_line_never_drops_an_ignored_flag_silently(argv, flag, capsys):
    code, out, err = cli(BASE + argv + ["--json"], capsys)
    if code == 2:
        one_line_error(code, err, flag)
    else:
        assert code == 0
        assert any(a.startswith(f"ignored {flag}=") for a in json.loads(out)["assumptions"])


# ------------------------------------------------------------------------------------------------ positions
def test_a_sequence_beyond_the_models_positions_is_a_warning_in_json(capsys):
    """Issue 14: a sequence longer than max_position_embeddings gave no warning."""
    model = "Qwen/Qwen3-8B"
    limit = find_model(model).max_position_embeddings
    assert limit == 40960
    code, out, _ = cli(["estimate", model, "--gpu", "h100-sxm", "--seq", str(limit + 1), "--json"], capsys)
    assert code == 0
    notes = [a for a in json.loads(out)["assumptions"] if "max_position_embeddings" in a]
    assert len(notes) == 1 and "40,960" in notes[0] and "40,961" in notes[0]
    code, out, _ = cli(["estimate", model, "--gpu", "h100-sxm", "--seq", str(limit), "--json"], capsys)
    assert not [a for a in json.loads(out)["assumptions"] if "max_position_embeddings" in a]


def test_the_warning_is_printed_and_counts_virtual_tokens(capsys):
    code, out, _ = cli(["estimate", "Qwen/Qwen3-8B", "--gpu", "h100-sxm", "--seq", "40950", "--tuning", "prompt",
                        "--virtual-tokens", "20"], capsys)
    assert code == 0 and "max_position_embeddings" in out.replace("\n", " ")


def test_unknown_positions_give_no_warning():
    spec = replace(find_model("Qwen/Qwen3-8B"), max_position_embeddings=0)
    s = build_scenario(spec, Hardware(gpu=find_gpu("h100-sxm")), {"seq_len": 10**6})
    assert not [a for a in s.assumed if "max_position_embeddings" in a]


def test_config_json_positions_reach_the_warning(tmp_path, capsys):
    cfg = {"model_type": "qwen2", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
           "num_key_value_heads": 2, "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 1024}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert find_model(str(tmp_path)).max_position_embeddings == 1024
    code, out, _ = cli(["estimate", str(tmp_path), "--gpu", "rtx4090", "--seq", "2048", "--json"], capsys)
    assert code == 0 and any("max_position_embeddings (1,024)" in a for a in json.loads(out)["assumptions"])


def test_positions_change_no_estimate_of_a_rope_model():
    """max_position_embeddings is a parameter count only for learned positions: filling it moves no rope estimate."""
    filled = [m for m in models() if m.max_position_embeddings and m.position != "learned"]
    assert len(filled) >= 10
    hw = Hardware(gpu=find_gpu("h100-sxm"))
    for m in filled:
        a = estimate(build_scenario(m, hw, {"seq_len": 1024}))
        b = estimate(build_scenario(replace(m, max_position_embeddings=0), hw, {"seq_len": 1024}))
        assert (a.device_total.peak.total, a.host.peak.total, a.total_params) == (
            b.device_total.peak.total, b.host.peak.total, b.total_params), m.id
