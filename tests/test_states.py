"""Model-state bytes against hand derivations from docs/knobs.md (A.2, A.6, D, F.4)."""
import pytest

from memfit.roles.estimate import estimate
from memfit.memory.inventory import count_params, scenario_tensors
from memfit.memory.states import model_states


def _states(s):
    tensors = scenario_tensors(s)
    return tensors, model_states(s, tensors)


def test_zero3_model_states_are_16_bytes_per_param_over_gpus(scenario):
    # bf16 params + bf16 grads + fp32 master + Adam m, v, all partitioned: 2 + 2 + 12 bytes / N
    s = scenario("qwen2-7b-instruct", gpus=4, profile="openrlhf", zero_stage=3, micro_batch=1, seq_len=128)
    tensors, ms = _states(s)
    phi = count_params(s.model)
    persistent = sum(t.total for t in tensors if t.numel < s.param_persistence_threshold)
    expected = 16 * phi / 4 + 2 * persistent
    got = ms.weights + ms.grads_after_backward + ms.optimizer
    assert got == pytest.approx(expected, rel=1e-3)


def test_zero2_replicates_bf16_params_and_partitions_the_rest(scenario):
    s = scenario("qwen2-7b-instruct", gpus=4, profile="openrlhf", zero_stage=2)
    _, ms = _states(s)
    phi = count_params(s.model)
    assert ms.weights == 2 * phi
    assert ms.optimizer == 12 * -(-phi // 4)
    assert ms.grads_after_backward == 2 * -(-phi // 4)
    assert ms.grads_between_steps == 0  # grads_in_partition is freed after the step (measured, GA 1)
    # OpenRLHF leaves reduce_bucket_size "auto" -> DeepSpeed's 5e8 elements, bf16, one buffer without
    # overlap, alive only in backward, plus the flatten of the bucket being reduced
    assert ms.engine_buffers == 0
    assert ms.backward_buffers == 500_000_000 * 2 * 2


def test_hf_auto_fills_zero3_buckets_from_hidden_size(scenario):
    s = scenario("qwen2-7b-instruct", gpus=4, profile="hf-trainer", zero_stage=3)
    h = s.model.hidden_size
    assert s.reduce_bucket_size == h * h
    assert s.prefetch_bucket_size == int(0.9 * h * h)
    assert s.param_persistence_threshold == 10 * h


def test_pure_bf16_foreach_adamw_peaks_at_10_bytes_per_param(scenario):
    # bf16 weights 2 + bf16 grads 2 + bf16 m, v 4 + foreach sqrt list 2 (torch _multi_tensor_adamw)
    s = scenario("mistral-7b", gpu="a100-80gb", precision="bf16-pure", optimizer="adamw-foreach",
                 micro_batch=1, seq_len=512, checkpointing="full", attention="flash")
    e = estimate(s)
    step = e.allocated.phases["optimizer_step"]
    phi = count_params(s.model)
    model_bytes = step.get("weights") + step.get("gradients") + step.get("optimizer_states")
    assert model_bytes == 10 * phi


def test_lora_r8_all_linear_on_llama31_8b_trains_peft_count(scenario):
    s = scenario("llama-3.1-8b-instruct", tuning="lora", lora_rank=8)
    tensors, _ = _states(s)
    # PEFT prints "trainable params: 20,971,520" for r=8 on all linear layers of Llama-3-8B
    assert sum(t.total for t in tensors if t.trainable) == 20_971_520


def test_offload_ratio_moves_optimizer_bytes_from_host_to_gpu(scenario):
    common = dict(model="qwen2.5-72b-instruct", gpu="a100-80gb", gpus=8, profile="openrlhf", zero_stage=3,
                  offload_optimizer="cpu", pin_memory=False, sub_group_size=100_000_000)
    _, full = _states(scenario(**common))
    _, partial = _states(scenario(ratio=0.9, **common))
    moved_gpu = partial.optimizer - full.optimizer
    moved_host = full.host_bytes - partial.host_bytes
    assert moved_gpu > 0
    # 16 B (master, m, v, fp32 grad) per element move to the GPU and leave the host
    assert moved_host == pytest.approx(moved_gpu, rel=0.02)
    part = -(-count_params(scenario(**common).model) // 8)
    assert moved_gpu == pytest.approx(16 * part * 0.1, rel=0.02)


def test_ratio_does_not_change_the_zero3_offload_resume(scenario):
    # the optimizer file holds every fp32 partition (4 B) but only CPUAdam's m, v; those loaded tensors become
    # CPUAdam's state, so resume adds 4 B x partition whatever the ratio (stage3.py::_rigid_state_dict)
    common = dict(model="qwen2.5-72b-instruct", gpu="a100-80gb", gpus=8, profile="openrlhf", zero_stage=3,
                  offload_optimizer="cpu", pin_memory=False, sub_group_size=100_000_000)
    _, full = _states(scenario(**common))
    _, partial = _states(scenario(ratio=0.9, **common))
    part = -(-count_params(scenario(**common).model) // 8)
    assert full.resume_host == partial.resume_host == 4 * part


def test_ratio_without_small_sub_groups_offloads_everything(scenario):
    # sub_group_size 1e9 > partition -> one sub-group -> int((1 - 0.9) * 1) = 0 stay on the GPU (knobs A.6)
    common = dict(model="qwen2-7b-instruct", gpus=4, profile="openrlhf", zero_stage=3, offload_optimizer="cpu")
    _, a = _states(scenario(**common))
    _, b = _states(scenario(ratio=0.9, **common))
    assert a.optimizer == b.optimizer == 0


def test_pinned_host_buffers_cost_more_than_unpinned(scenario):
    common = dict(model="qwen2.5-72b-instruct", gpu="a100-80gb", gpus=8, profile="openrlhf", zero_stage=3,
                  offload_optimizer="cpu")
    _, pinned = _states(scenario(pin_memory=True, **common))
    _, unpinned = _states(scenario(pin_memory=False, **common))
    assert pinned.host_bytes > unpinned.host_bytes
    assert sum(b.nbytes for b in pinned.host) == sum(b.nbytes for b in unpinned.host)


@pytest.mark.parametrize("upcast, other_bytes", [(False, 2), (True, 4)])
def test_qlora_stores_decoder_linears_in_4bit(scenario, upcast, other_bytes):
    # PEFT's prepare_model_for_kbit_training upcasts what is not 4-bit (embeddings, norms, head) to fp32
    s = scenario("llama-3.1-8b-instruct", tuning="qlora", kbit_upcast=upcast)
    tensors, ms = _states(s)
    quantized = sum(t.total for t in tensors if t.quantized)
    other_frozen = sum(t.total for t in tensors if not t.trainable and not t.quantized)
    adapters = sum(t.total for t in tensors if t.trainable)
    nf4_dq = 0.5 + 1 / 64 + 4 / (64 * 256)
    assert ms.weights == int(quantized * nf4_dq + other_frozen * other_bytes) + adapters * 4


def test_fsdp_gathers_4bit_linears_packed_not_in_the_compute_dtype(scenario):
    # FSDP flattens the bnb quant_storage bytes as they are, so a gathered QLoRA layer is ~0.5 B/param;
    # gathering it as bf16 overstated Mixtral QLoRA on 2 GPUs by 3.7 GiB (fms-a100-61: 19.68 GiB measured)
    s = scenario("mixtral-8x7b", gpu="a100-80gb", gpus=2, tuning="qlora", kbit_upcast=False, engine="fsdp",
                 lora_rank=16, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    tensors, ms = _states(s)
    nf4_dq = 0.5 + 1 / 64 + 4 / (64 * 256)
    layer = [t for t in tensors if t.per_layer]
    unit = sum(t.total * (nf4_dq if t.quantized else 2 if t.kind != "lora" else 4) for t in layer) / s.model.num_layers
    # FSDP2 (transformers 5.24's default): the running layer and two all-gather outputs (accelerate_fsdp.py)
    assert ms.gathered_forward == 3 * int(unit)
    assert ms.gathered_forward < 0.3 * 3 * 2 * sum(t.total for t in layer) / s.model.num_layers


def test_old_bitsandbytes_keeps_every_4bit_linear_input(scenario):
    # bitsandbytes < 0.43.2 MatMul4Bit stored its input A on ctx (fixed by PR #1270): with LoRA on q,k,v,o
    # only, the MLP's 4-bit Linears now keep their inputs too: the normed input (2h) and the product (2I)
    from memfit.memory.activations import activations

    common = dict(model="mistral-7b", gpu="a100-80gb", tuning="qlora", lora_rank=16, kbit_upcast=False,
                  lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), micro_batch=2, seq_len=1024,
                  attention="flash", padding="packed")
    old, new = scenario(bnb_saves_input=True, **common), scenario(**common)
    adapters = [t for t in _states(new)[0] if t.kind == "lora"]
    extra = activations(old, adapters).layer_saved - activations(new, adapters).layer_saved
    m = old.model
    assert extra == 2048 * (2 * m.hidden_size + 2 * m.intermediate_size)


# ---------------------------------------------------------------- engine facts measured with bench/engine.py
def test_zero2_offload_reduces_the_head_with_an_fp64_norm_copy_beside_every_activation(scenario):
    # stage_1_and_2.py: the oversized head grad is cloned (bf16, 2 B) and set_norm_for_param_grad_in_gpu
    # copies this rank's slice of it to fp64 (get_norm_dtype, 8 B) while every activation is still saved
    s = scenario("llama-3.1-8b-instruct", gpu="a100-80gb", gpus=8, zero_stage=2, offload_optimizer="cpu",
                 micro_batch=1, seq_len=1024)
    tensors, ms = _states(s)
    psi = sum(t.total for t in tensors if t.trainable)
    part = -(-psi // 8)
    vocab_h = 128256 * 4096  # untied lm_head = embedding size, both inside one partition (part ~ 1e9)
    assert vocab_h < part
    assert ms.head_reduce == 2 * vocab_h + 8 * vocab_h
    assert ms.last_reduce == 2 * vocab_h + 8 * vocab_h  # the embedding's, after every layer
    assert ms.grads_unreduced == 0
    backward = estimate(s).allocated.phases["backward"]
    # the head's reduction is its own moment: saved activations + head grad + fp64 copy, no loss buffers
    assert backward.get("gradients") == ms.head_reduce
    assert backward.get("logits_loss") == 0


def test_zero1_offload_reduces_after_backward_with_every_full_grad_alive(scenario):
    # ZeRO-1 without overlap_comm reduces nothing in backward: at the boundary the embedding (first in the
    # flat group, rank 0's partition) is reduced while all 2-byte grads are still there
    s = scenario("llama-3.1-8b-instruct", gpu="a100-80gb", gpus=8, zero_stage=1, offload_optimizer="cpu")
    tensors, ms = _states(s)
    psi = sum(t.total for t in tensors if t.trainable)
    embed = 128256 * 4096
    assert ms.head_reduce == 0
    assert ms.last_reduce == 2 * psi + 8 * embed


def test_zero3_keeps_a_tied_head_gathered_into_backward_even_when_frozen(scenario):
    # the tied head's weight is the embedding: fetched by the head and kept for its backward (measured
    # qwen2-25m LoRA ZeRO-3: + 2 B x vocab x hidden of gathered weights); the head is the first thing kept
    from memfit.memory.states.deepspeed import zero3_retained as _zero3_retained

    s = scenario("qwen2-1.5b-instruct", gpus=2, zero_stage=3, tuning="lora", lora_rank=16)
    tensors, _ = _states(s)
    assert _zero3_retained(s, tensors, max_reuse=0) == 151936 * 1536
    u = scenario("llama-3.1-8b-instruct", gpus=2, zero_stage=3, tuning="lora", lora_rank=16)
    assert _zero3_retained(u, _states(u)[0], max_reuse=0) == 128256 * 4096  # the untied lm_head


def test_zero3_fetches_a_moe_block_whole_beside_what_it_retains(scenario):
    # the sparse MoE block is a ZeRO-3 leaf module (LLaMA-Factory add_z3_leaf_module): router + all 8 experts
    # are gathered at once; with max_reuse_distance 1e9 a Mixtral-8x7B layer (1.4B elements) is not retained,
    # so the working set is the head (kept for its backward) + one whole block + the prefetch bucket
    s = scenario("mixtral-8x7b", gpus=8, zero_stage=3)
    _, ms = _states(s)
    block = 8 * 3 * 4096 * 14336 + 4096 * 8
    assert ms.gathered_forward == ms.gathered_backward == 2 * (32000 * 4096 + block + int(0.9 * 4096 * 4096))
    # a dense model has no such unit: head + prefetch
    d = scenario("llama-3.1-8b-instruct", gpus=8, zero_stage=3)
    assert _states(d)[1].gathered_forward == 2 * (128256 * 4096 + int(0.9 * 4096 * 4096))


def test_fsdp2_root_reduce_scatter_buffer_and_sharded_resume(scenario):
    # fully_shard on the whole model's rest (a plain loop's layout: the root group holds embedding, norm and head;
    # the HF Trainer's accelerate layout is test_accelerate_fsdp2_reduces_the_head_first_and_the_embedding_last)
    s = scenario("llama-3.1-8b-instruct", gpu="a100-80gb", gpus=8, fsdp_strategy="full_shard",
                 precision="bf16-mixed", profile="peft-loop")
    tensors, ms = _states(s)
    root = sum(t.total for t in tensors if t.trainable and not t.per_layer)
    head = 128256 * 4096
    # fp32 reduce-scatter input of the whole root group + the head's bf16 grad (foreach_reduce's loop variable)
    assert ms.last_reduce == 4 * root + 2 * head
    # each rank torch.loads its own shards: fp32 params + Adam m, v = 12 B / 8 per param
    assert ms.resume_host == ms.weights + ms.optimizer
    assert ms.resume_host == pytest.approx(12 * sum(t.total for t in tensors) / 8, rel=1e-3)
    pure = scenario("llama-3.1-8b-instruct", gpu="a100-80gb", gpus=8, fsdp_strategy="full_shard",
                    precision="bf16-pure", profile="peft-loop")
    assert _states(pure)[1].last_reduce == 2 * root + 2 * head  # no MixedPrecisionPolicy: bf16 reduce


@pytest.mark.parametrize("precision, grad, reduce", [("bf16-mixed", 4, 4), ("bf16-pure", 2, 2)])
def test_accelerate_fsdp2_reduces_the_head_first_and_the_embedding_last(scenario, precision, grad, reduce):
    s = scenario("llama-3.1-8b-instruct", gpu="a100-80gb", gpus=8, fsdp_strategy="full_shard", precision=precision)
    _, ms = _states(s)
    vocab_rows = 128256 * 4096
    assert s.fsdp_version == 2
    # the [norm, head] unit's post-backward right after the head's backward: its gradients and reduce-scatter input
    assert ms.head_grads == (grad + reduce) * (vocab_rows + 4096)
    # the embedding's, last: its gradient and reduce-scatter input (its parameters resharded first)
    assert ms.last_reduce == (grad + reduce) * vocab_rows and ms.gathered_end == 0


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_lora_resume_holds_frozen_fragments_beside_the_optimizer_file(scenario, stage):
    # engine.py::_load_checkpoint returns frozen_param_fragments in client_state: loaded beside the
    # optimizer file (ZeRO-2 whole frozen params, ZeRO-3 this rank's partitions)
    s = scenario("llama-3.1-8b-instruct", gpus=4, zero_stage=stage, tuning="lora", lora_rank=16)
    tensors, ms = _states(s)
    frozen = 2 * sum(t.total for t in tensors if not t.trainable)
    part = -(-sum(t.total for t in tensors if t.trainable) // 4)
    fragments = frozen if stage == 2 else frozen // 4
    assert ms.resume_host == pytest.approx(fragments + 12 * part, abs=4)


def test_a_lora_target_matches_every_module_whose_name_ends_with_it(scenario):
    """PEFT matches target_modules by the name's tail: Qwen-1's "c_proj" adapts attn.c_proj and mlp.c_proj."""
    s = scenario(model="Qwen/Qwen-7B", gpu="a100-80gb", tuning="lora", lora_rank=8, lora_targets=("c_proj",))
    m = s.model
    h, f = m.hidden_size, m.intermediate_size  # attn.c_proj: h -> h; mlp.c_proj: f -> h (f: the width of w1, w2)
    lora = [t for t in scenario_tensors(s) if t.kind == "lora"]
    assert {t.module for t in lora} == {"attn.c_proj", "mlp.c_proj"}
    assert sum(t.numel * t.count for t in lora) == m.num_layers * 8 * (2 * h + (f + h))
