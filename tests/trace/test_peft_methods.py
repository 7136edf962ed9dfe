"""PEFT methods besides LoRA: their facts come from PEFT's own layers, and the estimate agrees with the trace of
the real model wrapped by PEFT."""
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from memfit.errors import MemfitError  # noqa: E402
from memfit.facts.adapters import layer_facts, peft_methods  # noqa: E402
from memfit.facts.catalog import find_gpu, find_model  # noqa: E402
from memfit.facts.profiles import build_scenario  # noqa: E402
from memfit.facts.scenario import Hardware  # noqa: E402
from memfit.roles.estimate import estimate  # noqa: E402
from memfit.trace import peft_facts  # noqa: E402
from peft_traces import PATH, COMPARED, TraceCache, fingerprint, fresh, peak_of, trace_phases, traced_peak  # noqa: E402

CACHE = TraceCache(PATH)  # the traced peaks of the rows below (peft_traces.py writes it)
LIVE = ("ia3-autocast", "vera-bf16-ckpt", "oft-fp32-adapters-eager")  # re-traced every run against the file


def _scenario(tuning: str, model: str = "qwen2.5-0.5b", profile: str = "hf-trainer", **knobs):
    given = {"tuning": tuning, "micro_batch": 1, "seq_len": 512} | knobs
    if tuning == "trainable_tokens":  # PEFT has no default count of rows
        given = {"trainable_tokens": 64} | given
    return build_scenario(find_model(model), Hardware(find_gpu("a100-80gb")), given, profile)


def test_shipped_facts_are_what_the_installed_peft_does():
    import peft

    assert layer_facts()["peft"] == peft.__version__, "re-derive: python -m memfit.trace.peft_facts"
    assert peft_facts.render(peft_facts.derive()) == peft_facts.OUT.read_text()


def test_sizes_are_read_back_as_products_of_named_widths():
    s = peft_facts.SIZES
    assert peft_facts.monomial(s["T"] * s["I"], s) == "T*I"
    assert peft_facts.monomial(s["I"] * s["O"], s) == "I*O"
    assert peft_facts.monomial(2 * s["R"], s) == "2*R"
    assert peft_facts.monomial(1, s) == "1"


@pytest.mark.parametrize("method", peft_methods())
def test_trainable_parameters_equal_peft_on_the_built_model(method):
    from memfit.trace.build import build_model

    s = _scenario(method, lora_rank=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_model(s)  # on the meta device: PEFT's real layers, no memory
    real = sum(p.numel() for p in built.model.parameters() if p.requires_grad)
    assert estimate(s).trainable_params == real


def _peak(profile) -> int:
    return max(sum(b.get(c) for c in COMPARED) for b in profile.phases.values())


AUTOCAST = dict()  # hf-trainer: autocast over fp32 adapters
BF16_CKPT = dict(profile="peft-loop", adapter_dtype="bf16", checkpointing="full", micro_batch=2, seq_len=1024)
FP32_ADAPTERS = dict(profile="peft-loop", attention="eager")  # bf16 weights, fp32 adapters, no autocast


def _runs():
    for method in peft_methods():
        yield method, "bf16-ckpt", BF16_CKPT
        yield method, "autocast", AUTOCAST
        # LN tuning with fp32 norm copies and no autocast is refused (torch refuses the dtype mix)
        if method != "ln_tuning":
            yield method, "fp32-adapters-eager", FP32_ADAPTERS


def _run_scenario(method: str, knobs: dict):
    if method in ("vera", "adalora") and knobs.get("checkpointing"):
        knobs = knobs | {"lora_dropout": 0.1}  # the dropout mask these methods keep per adapted input
    return _scenario(method, **knobs)


@pytest.mark.parametrize("method, _, knobs", list(_runs()), ids=[f"{m}-{i}" for m, i, _ in _runs()])
def test_estimate_within_3_percent_of_the_trace(method, _, knobs):
    s = _run_scenario(method, knobs)
    est, (traced, _cached) = _peak(estimate(s).allocated), traced_peak(s, CACHE)
    assert abs(est - traced) / traced <= 0.03, (method, est, traced)


FACTOR_ROWS = [
    ("lokr", AUTOCAST | dict(lora_rank=8)),  # every Linear takes PEFT's low-rank w2 branch (Qwen2.5-0.5B widths)
    ("lokr", BF16_CKPT | dict(lora_rank=64)),  # every Linear takes the full-w2 branch
    ("oft", FP32_ADAPTERS),
    ("boft", BF16_CKPT),  # down_proj's 4864 x 4864 rotation and permutation buffer (five minutes of tracing)
]
FACTOR_IDS = ["lokr-r8-autocast", "lokr-r64-bf16-ckpt", "oft-fp32-adapters", "boft-bf16-ckpt"]


@pytest.mark.parametrize("method, knobs", FACTOR_ROWS, ids=FACTOR_IDS)
def test_methods_with_factor_sizes_on_every_linear_within_3_percent(method, knobs):
    """LoKr, OFT and BOFT size their tensors by factors of each Linear's widths (facts/peft_shapes.py); adapting
    every Linear makes those tensors (LoKr's weight-sized delta, OFT's rotated input, BOFT's I x I rotation and
    fp32 permutation buffer) show in the peak: LoKr r8 under autocast peaks 26% above LoRA r1, OFT with fp32
    adapters 5% above."""
    s = _scenario(method, lora_targets=("all-linear",), **knobs)
    est, (traced, _cached) = _peak(estimate(s).allocated), traced_peak(s, CACHE)
    assert abs(est - traced) / traced <= 0.03, (method, est, traced)


def cached_rows() -> dict:
    """Every traced row of this module, by id: what peft_traces.json holds."""
    rows = {f"{m}-{i}": _run_scenario(m, k) for m, i, k in _runs()}
    rows |= {f"all-linear-{i}": _scenario(m, lora_targets=("all-linear",), **k) for (m, k), i in zip(FACTOR_ROWS, FACTOR_IDS)}
    rows |= {f"modules-to-save-{m}-{n}": _scenario(m, model=n, modules_to_save=mods) for m, n, mods in MODULES_ROWS}
    return rows


def test_the_trace_file_is_fresh_and_holds_every_row():
    stale = [row for row, s in cached_rows().items() if not fresh(CACHE.get(fingerprint(s)))]
    assert not stale, (f"{len(stale)} rows of tests/trace/peft_traces.json are missing or traced by other libraries "
                       f"or trace code (first: {stale[0]}): run python tests/trace/peft_traces.py")


@pytest.mark.parametrize("row", LIVE)
def test_a_live_trace_is_what_the_file_holds(row):
    s = cached_rows()[row]
    entry = CACHE.get(fingerprint(s))
    assert entry is not None and peak_of(trace_phases(s)) == peak_of(entry["profile"]), row


def test_ia3_scales_the_mlp_input_and_the_others_outputs():
    s = _scenario("ia3")
    assert s.lora_targets == ("k", "v", "down", "proj")
    assert any("PEFT's default" in a for a in s.assumed)
    # k, v: a vector as wide as their output; down: as wide as its input (the MLP intermediate)
    m = s.model
    kv = m.num_kv_heads * m.head_dim
    assert estimate(s).trainable_params == m.num_layers * (2 * kv + m.intermediate_size)


@pytest.mark.parametrize("knobs, words", [
    (dict(tuning="ia3", dora=True), "DoRA is a LoRA option"),
    (dict(tuning="loha", lora_dropout=0.1), "no input dropout"),
    (dict(tuning="ia3", lora_targets=("nonexistent",)), "match no module"),
    (dict(tuning="ln_tuning", profile="peft-loop"), "LN tuning with fp32 norm copies"),
    (dict(tuning="boft", lora_dropout=0.1), "no input dropout"),
])
def test_options_a_method_does_not_have_are_refused(knobs, words):
    with pytest.raises(MemfitError, match=words):
        estimate(_scenario(**knobs))


def test_a_rank_for_a_rankless_method_is_refused_on_the_command_line():
    out = subprocess.run([sys.executable, "-m", "memfit.interfaces.cli.main", "estimate", "Qwen/Qwen2.5-0.5B", "--gpu",
                          "a100-80gb", "--tuning", "boft", "--lora-rank", "8"], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == ("memfit: error: --lora-rank has no effect here: an adapter rank, and --tuning "
                                  "boft has none; leave it out")


def test_boft_refuses_a_linear_its_blocks_do_not_divide():
    from dataclasses import replace

    odd = replace(find_model("qwen2.5-0.5b"), intermediate_size=4862)  # down_proj reads 4862 = 4 * 1215 + 2
    given = {"tuning": "boft", "lora_targets": ("all-linear",)}
    with pytest.raises(MemfitError, match="4862 wide is not a whole number of PEFT's blocks of 4"):
        estimate(build_scenario(odd, Hardware(find_gpu("a100-80gb")), given, "hf-trainer"))
    assert estimate(build_scenario(odd, Hardware(find_gpu("a100-80gb")), given | {"lora_targets": ("q", "v")},
                                   "hf-trainer")).trainable_params > 0


def test_boft_counts_its_fp32_permutation_buffer_per_adapted_linear():
    """Each adapted Linear keeps an I x I fp32 buffer (PEFT boft_P): the frozen weights grow by 4 I^2 a Linear."""
    from memfit.memory.inventory import tuned_tensors

    s = _scenario("boft", lora_targets=("q",))
    buffers = [t for t in tuned_tensors(s.model, "boft", s.lora_rank, s.lora_targets) if t.element_bytes]
    h = s.model.hidden_size
    assert sum(t.total * t.element_bytes for t in buffers) == s.model.num_layers * h * h * 4


def test_prompt_tuning_runs_the_virtual_tokens_through_every_layer():
    from memfit.memory.activations import activations

    prompt = _scenario("prompt", virtual_tokens=64)
    longer = _scenario("prompt", virtual_tokens=64, seq_len=512 + 64)
    assert activations(prompt, []).layer_saved == activations(longer.with_changes(tuning="lora"), []).layer_saved
    assert estimate(prompt).trainable_params == 64 * prompt.model.hidden_size


def test_cli_estimates_a_peft_method_and_lists_its_default_targets():
    out = subprocess.run([sys.executable, "-m", "memfit.interfaces.cli.main", "estimate", "Qwen/Qwen2.5-0.5B", "--gpu", "a100-80gb",
                          "--tuning", "vera", "--seq", "512"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "vera targets=q,v" in out.stdout


MODULES_ROWS = [
    ("lora", "qwen2.5-0.5b", ("lm_head",)),  # tied head: the copy is made from the embedding and trains untied
    ("ia3", "llama-3.2-1b", ("embed_tokens",)),
]


@pytest.mark.parametrize("method, model, modules", MODULES_ROWS)
def test_modules_to_save_train_a_copy_beside_the_frozen_original(method, model, modules):
    from memfit.trace.build import build_model

    s = _scenario(method, model=model, modules_to_save=modules)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = sum(p.numel() for p in build_model(s).model.parameters() if p.requires_grad)
    e = estimate(s)
    assert e.trainable_params == real
    assert e.trainable_params > s.model.vocab_size * s.model.hidden_size
    traced, _cached = traced_peak(s, CACHE)
    assert abs(_peak(e.allocated) - traced) / traced <= 0.03


def test_modules_to_save_names_what_is_valid():
    with pytest.raises(MemfitError, match="choose from: embed_tokens, lm_head"):
        _scenario("lora", modules_to_save=("mlp",))
    with pytest.raises(MemfitError, match="goes with LoRA"):
        _scenario("prompt", modules_to_save=("lm_head",))
