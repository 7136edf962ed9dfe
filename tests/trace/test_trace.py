"""memfit trace: the real transformers/PEFT step on fake tensors, checked against arithmetic and a real run.

Tiny Llama-shaped models keep the file fast; every size below is a multiple of 512 bytes so the
allocator rounding does not blur the exact formulas.
"""
import json
import subprocess
import sys
from functools import cache

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[trace])")

from memfit.facts.catalog import GpuSpec, ModelSpec, find_model  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402
from memfit.facts.scenario import Hardware, Scenario  # noqa: E402
from memfit.trace.accountant import Accountant, block_bytes  # noqa: E402
from memfit.trace.build import build_model, hf_config  # noqa: E402
from memfit.trace.output import render, write_timeline  # noqa: E402
from memfit.trace.run import layer_profile, run_trace  # noqa: E402

GPU = GpuSpec(id="a100", name="A100", memory_bytes=80 * 2**30, compute_capability=8.0)
LINEARS = {"q_proj": ["q"], "k_proj": ["k"], "v_proj": ["v"], "o_proj": ["o"],
           "gate_proj": ["gate"], "up_proj": ["up"], "down_proj": ["down"]}
# hidden h, heads a, kv heads k, head_dim d, intermediate I, vocab V; batch B x T tokens
h, a, k, d, I, V = 256, 4, 2, 64, 512, 1024
B, T = 2, 64
n = B * T
TINY = ModelSpec(id="tiny-llama", arch="llama", hidden_size=h, num_layers=2, num_heads=a, num_kv_heads=k,
                 head_dim=d, intermediate_size=I, vocab_size=V, linear_names=LINEARS)


def scenario(**knobs) -> Scenario:
    base = dict(model=TINY, hardware=Hardware(GPU), tuning="full", precision="bf16-pure", optimizer="adamw-foreach",
                attention="sdpa", padding="packed", micro_batch=B, seq_len=T)
    base.update(knobs)
    return Scenario(**base)


@cache
def per_layer(**knobs) -> dict:
    return layer_profile(scenario(**knobs))


# ---------------------------------------------------------------------------------------------- accountant
def test_storages_are_rounded_to_512_byte_blocks_and_counted_once():
    acc = Accountant()
    with acc:
        one = torch.empty(1, dtype=torch.uint8)
        assert acc.live_bytes == 512
        more = torch.empty(513, dtype=torch.uint8)
        assert acc.live_bytes == 512 + 1024
        view = more[1:].view(2, 256)  # a view shares its base's storage
        assert acc.live_bytes == 1536
        nothing = torch.empty(0)
        assert acc.live_bytes == 1536
        del more
        assert acc.live_bytes == 1536  # the view keeps the storage alive
        del view
        assert acc.live_bytes == 512
        del one, nothing
        assert acc.live_bytes == 0
    assert [block_bytes(x) for x in (0, 1, 512, 513, 4096)] == [0, 512, 512, 1024, 4096]


def test_peak_breakdown_is_the_moment_of_the_peak():
    acc = Accountant()
    with acc:
        acc.enter_phase("forward", 0)
        x = torch.empty(1024, dtype=torch.uint8)
        acc.region = "logits_loss"
        y = torch.empty(2048, dtype=torch.uint8)
        del y
        acc.region = "activations"
        z = torch.empty(1536, dtype=torch.uint8)
    peak = acc.profile(0).phases["forward"]
    assert peak.parts == {"activations": 1024, "logits_loss": 2048}
    del x, z


# ---------------------------------------------------------------------------------------------- model building
@pytest.mark.parametrize("model_id", ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B", "google/gemma-2-9b",
                                      "microsoft/phi-4", "mistralai/Mixtral-8x7B-Instruct-v0.1",
                                      "THUDM/glm-4-9b-chat", "tiiuae/falcon-7b", "Qwen/Qwen3-8B"])
def test_built_model_has_exactly_the_catalog_parameter_count(model_id):
    from transformers import AutoModelForCausalLM

    spec = find_model(model_id)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(spec, "eager"))
    assert sum(p.numel() for p in model.parameters()) == spec.published_params


def test_traced_weights_equal_the_parameter_bytes():
    shapes = [(V, h), (V, h), (h,)]  # embed_tokens, lm_head (untied), final norm
    for _ in range(TINY.num_layers):
        shapes += [(a * d, h), (k * d, h), (k * d, h), (h, a * d), (I, h), (I, h), (h, I), (h,), (h,)]
    params = sum(block_bytes(2 * torch.Size(s).numel()) for s in shapes)
    buffers = 2 * block_bytes(4 * d // 2)  # rotary inv_freq and original_inv_freq (fp32)
    result = run_trace(scenario())
    assert result.marks["step_end"].get("weights") == params + buffers
    assert result.marks["backward_end"].get("gradients") == params


def test_lora_adapters_are_the_only_trainable_params_in_fp32():
    built = build_model(scenario(tuning="lora", precision="bf16-mixed"), device="cpu")
    trainable = dict((name, p) for name, p in built.model.named_parameters() if p.requires_grad)
    assert trainable and all("lora_A" in name or "lora_B" in name for name in trainable)
    assert all(p.dtype == torch.float32 for p in trainable.values())
    per_layer_params = 8 * sum(i + o for i, o in [(h, a * d), (h, k * d), (h, k * d), (a * d, h), (h, I), (h, I), (I, h)])
    assert sum(p.numel() for p in trainable.values()) == TINY.num_layers * per_layer_params
    frozen = [p for p in built.model.parameters() if not p.requires_grad]
    assert all(p.dtype == torch.bfloat16 for p in frozen)


def test_lora_gradients_and_adam_states_follow_the_adapters():
    built = build_model(scenario(tuning="lora", precision="bf16-mixed"), device="meta")
    adapter_bytes = sum(block_bytes(4 * p.numel()) for p in built.trainable)
    result = run_trace(scenario(tuning="lora", precision="bf16-mixed"))
    assert result.marks["backward_end"].get("gradients") == adapter_bytes
    assert result.marks["step_end"].get("optimizer_states") == 2 * adapter_bytes  # exp_avg, exp_avg_sq
    # torch's foreach AdamW holds one list-wide temporary (sqrt of exp_avg_sq) during step()
    assert result.extras["optimizer_step_temporaries"] == adapter_bytes


# ---------------------------------------------------------------------------------------------- activations
def test_sdpa_without_padding_saves_the_flash_set_per_layer():
    # 2 RMSNorms (fp32 upcast 4h, bf16 cast 2h, weighted output 2h), q 2h, attention out 2h, k/v 4kd,
    # gate/up/silu/product 8I, fp32 logsumexp 4a, 2 fp32 rsqrt scalars per token
    assert per_layer()["saved_per_layer"] == (20 * h + 4 * k * d + 8 * I + 4 * a + 8) * n


def test_eager_attention_adds_the_score_matrices():
    # fp32 softmax (4 B) + its bf16 copy (2 B) per score; K,V repeated to all heads; no logsumexp
    eager = per_layer(attention="eager")["saved_per_layer"]
    assert eager == (24 * h + 8 * I + 8) * n + 6 * B * a * T * T
    assert eager - per_layer()["saved_per_layer"] == 6 * B * a * T * T + (4 * h - 4 * k * d - 4 * a) * n


def test_padding_mask_switches_sdpa_to_the_mem_efficient_kernel():
    packed = run_trace(scenario())
    padded = run_trace(scenario(padding="padded"))
    assert set(packed.kernels) == {"sdpa:flash"}
    assert set(padded.kernels) == {"sdpa:efficient"}
    # repeat_kv'd K,V (4h instead of 4kd) and the additive bf16 mask B x 1 x T x T saved by every layer
    assert per_layer(padding="padded")["saved_per_layer"] == (24 * h + 8 * I + 4 * a + 8) * n + 2 * B * T * T


def test_checkpointing_keeps_only_the_layer_input():
    assert per_layer(checkpointing="full")["saved_per_layer"] == 2 * h * n
    off = run_trace(scenario()).profile.phases["forward"].get("activations")
    on = run_trace(scenario(checkpointing="full")).profile.phases["forward"].get("activations")
    assert on < off


def test_every_n_and_offloaded_checkpointing():
    def saved(**knobs):
        return run_trace(scenario(**knobs)).marks["forward_end"].get("activations")

    off, full = saved(), saved(checkpointing="full")
    every_2 = saved(checkpointing="every_n", checkpoint_every_n=2)  # layer 0 checkpointed, layer 1 not
    assert abs(every_2 - (off - per_layer()["saved_per_layer"] + 2 * h * n)) <= 1024
    # save_on_cpu around non-reentrant checkpoint moves the saved layer inputs to the host
    assert full - saved(checkpointing="offload") == TINY.num_layers * 2 * h * n


def test_lora_dropout_saves_a_bool_mask_like_cuda_native_dropout():
    plain = per_layer(tuning="lora", precision="bf16-mixed")["saved_per_layer"]
    dropout = layer_profile(scenario(tuning="lora", precision="bf16-mixed",
                                     lora_dropout=0.1))["saved_per_layer"]
    assert dropout - plain == (6 * h + I) * n  # one byte per input element of the 7 adapted linears


def test_tied_embeddings_are_counted_once():
    from dataclasses import replace

    tied = run_trace(scenario(model=replace(TINY, tie_embeddings=True)))
    untied = run_trace(scenario())
    assert untied.marks["step_end"].get("weights") - tied.marks["step_end"].get("weights") == 2 * V * h


def test_logits_and_loss_peaks():
    result = run_trace(scenario())
    forward = result.profile.phases["forward"].get("logits_loss")
    backward = result.profile.phases["backward"].get("logits_loss")
    # bf16 logits + fp32 copy (`logits.float()`) + fp32 log-softmax; backward adds fp32 grads
    assert 10 * n * V <= forward < 10 * n * V + 8192
    assert 12 * n * V <= backward < 12 * n * V + 8192
    # kept for backward: the fp32 log-softmax, nll_loss's int64 shifted targets and total_weight, the loss
    assert result.marks["forward_end"].get("logits_loss") == 4 * n * V + 8 * n + 512 + 512


def test_lora_under_autocast_saves_a_bf16_copy_of_each_adapter_input():
    full = per_layer()["saved_per_layer"]
    lora = per_layer(tuning="lora", precision="bf16-mixed")["saved_per_layer"]
    # norms lose their bf16 casts (-4h), the adapters of q,k,v,o,gate,up each save their own copy of the
    # input (+12h instead of the shared normed outputs' 4h), down's adapter saves a copy of the product
    # (same 2I); lora_A outputs (r wide) are saved by lora_B
    assert lora - full == (4 * h + 2 * 8 * 7) * n


def test_fake_trace_matches_a_real_cpu_run_byte_for_byte():
    for knobs in (dict(tuning="lora", precision="bf16-mixed", padding="padded", checkpointing="full"),
                  dict(attention="flash", padding="padded"),
                  dict(tuning="qlora", precision="bf16-mixed", attention="eager")):
        fake, real = run_trace(scenario(**knobs)), run_trace(scenario(**knobs), fake=False)
        assert fake.profile.to_json() == real.profile.to_json(), knobs
        assert {m: b.to_json() for m, b in fake.marks.items()} == {m: b.to_json() for m, b in real.marks.items()}


def test_qlora_weights_are_four_bit_storage_plus_constants():
    result = run_trace(scenario(tuning="qlora", precision="bf16-mixed"))
    quantized = [(a * d, h), (k * d, h), (k * d, h), (h, a * d), (I, h), (I, h), (h, I)] * TINY.num_layers

    def nf4(rows, cols):
        n_ = rows * cols
        blocks = -(-n_ // 64)
        return block_bytes(n_ // 2) + block_bytes(blocks) + block_bytes(4 * -(-blocks // 256)) + 512

    lora = sum(block_bytes(4 * 8 * i) + block_bytes(4 * 8 * o) for o, i in quantized)
    bf16 = 2 * block_bytes(2 * V * h) + (2 * TINY.num_layers + 1) * block_bytes(2 * h) + 2 * block_bytes(4 * d // 2)
    assert result.marks["step_end"].get("weights") == sum(nf4(*s) for s in quantized) + lora + bf16


# ---------------------------------------------------------------------------------------------- output and errors
def test_render_and_timeline_json(tmp_path):
    from rich.console import Console

    result = run_trace(scenario(tuning="lora", precision="bf16-mixed"))
    console = Console(record=True, width=120)
    render(result, console)
    text = console.export_text()
    assert "peak" in text and "activations" in text and "▲" in text
    data = json.loads(write_timeline(result, tmp_path / "t.json").read_text())
    assert data["profile"]["peak_bytes"] == result.profile.peak.total
    assert max(sum(row[3:]) for row in data["timeline"] if row[1] == 1) == result.profile.peak.total


def test_unsupported_combinations_say_why():
    with pytest.raises(MemfitError, match="sdpa or eager"):
        run_trace(scenario(model=find_model("tiiuae/falcon-7b"), attention="flash"))
    with pytest.raises(MemfitError, match="loss"):
        run_trace(scenario(loss="liger"))


def test_importing_memfit_trace_does_not_import_torch():
    code = "import sys, memfit, memfit.trace; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
