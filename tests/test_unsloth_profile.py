"""The unsloth profile models unsloth's own code, read from unsloth / unsloth_zoo 2026.10.9 (no GPU here, so no
trace): its fused linear cross entropy (memory/unsloth_loss.py) and its offloaded checkpointing
(memory/unsloth_offload.py)."""
import subprocess
import sys

from hypothesis import given, strategies as st

from memfit.facts.catalog import find_gpu, find_model
from memfit.facts.frameworks import framework, model_code
from memfit.facts.profiles import build_scenario
from memfit.facts.scenario import Hardware
from memfit.memory.activations import activations
from memfit.memory import unsloth_loss


def _scenario(model="llama-3.1-8b", profile="unsloth", gpu="a100-80gb", **knobs):
    given_ = {"tuning": "lora", "micro_batch": 1, "seq_len": 2048} | knobs
    return build_scenario(find_model(model), Hardware(find_gpu(gpu)), given_, profile)


def test_the_profile_names_the_release_it_was_read_from():
    code = model_code("unsloth")
    assert code["unsloth"] == code["unsloth_zoo"] == "2026.10.9"
    assert framework("unsloth").defaults["loss"] == "unsloth_ce"
    assert not framework("unsloth").plan["liger"]


@given(n=st.integers(1, 1 << 20), h=st.sampled_from([512, 896, 2048, 4096, 8192]),
       v=st.integers(1000, 300_000))
def test_chunk_rows_follow_the_fused_linear_rules(n, h, v):
    rows = unsloth_loss.chunk_rows(n, h, v)
    cap = max(unsloth_loss.BUDGET // (v * unsloth_loss.LOGIT_BYTES), 2)
    assert 1 <= rows <= min(n, unsloth_loss.MAX_ROWS)
    assert rows <= cap  # one chunk's fp32 logits stay within the 2 GiB budget
    assert rows in (n, cap) or rows & (rows - 1) == 0  # a power of two unless the batch or the budget is smaller
    assert rows >= min(n, 512, cap)  # never Liger's few rows: at least 512 (the GEMM floor)


def test_a_small_model_holds_its_whole_fp32_logits_where_liger_holds_a_few_rows():
    """Qwen2.5-0.5B, 512 tokens: 512 * 896 / 151936 rounds to 2 rows under Liger's rule; unsloth's floor is 512."""
    s = _scenario("qwen2.5-0.5b", seq_len=512)
    n, v = 512, s.model.vocab_size
    ours = activations(s, []).logits_forward_peak
    assert ours >= n * v * unsloth_loss.LOGIT_BYTES
    assert ours > 10 * activations(s.with_changes(loss="liger"), []).logits_forward_peak


def test_unsloth_offloads_all_but_the_last_layer_input_and_keeps_two_staging_buffers():
    s = _scenario(checkpointing="unsloth")
    m, n = s.model, s.tokens_per_micro_batch
    stored = n * m.hidden_size * 2
    act = activations(s, [])
    assert act.layer_checkpoint == 0
    assert act.host_offloaded == (m.num_layers - 1) * stored
    plain = activations(s.with_changes(profile="hf-trainer"), [])  # LLaMA-Factory's semantics: every input
    assert plain.host_offloaded == m.num_layers * stored
    assert act.outside_layers - plain.outside_layers == stored + 2 * stored  # last input (bf16) + staging


def test_short_rows_and_small_inputs_stay_on_the_gpu():
    short = activations(_scenario(checkpointing="unsloth", seq_len=256), [])  # < 512: torch's checkpointing
    small = activations(_scenario("qwen2.5-0.5b", checkpointing="unsloth", seq_len=512), [])  # 0.9 MiB < 2 MiB
    for act in (short, small):
        assert act.host_offloaded == 0 and act.layer_checkpoint > 0


def test_the_cli_says_the_loss_it_assumed():
    out = subprocess.run([sys.executable, "-m", "memfit.interfaces.cli.main", "estimate", "meta-llama/Llama-3.1-8B",
                          "--gpu", "a100-80gb", "--profile", "unsloth", "--tuning", "lora", "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "loss=unsloth_ce (unsloth default)" in out.stdout


def test_on_a_card_without_flash_attention_or_bf16_unsloth_falls_back_as_its_code_does(scenario):
    # unsloth/models/_utils.py: flash-attn and bf16 need compute capability >= 8; below, xformers / SDPA and float16
    t4 = scenario(model="llama-3.1-8b", gpu="t4", profile="unsloth", tuning="qlora", seq_len=2048, micro_batch=1)
    assert (t4.attention, t4.precision) == ("sdpa", "fp16-pure")
    assert any("below compute capability 8" in a for a in t4.assumed)
    a100 = scenario(model="llama-3.1-8b", gpu="a100-80gb", profile="unsloth", tuning="qlora", seq_len=2048)
    assert (a100.attention, a100.precision) == ("flash", "bf16-pure")
