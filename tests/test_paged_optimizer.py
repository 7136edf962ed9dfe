"""bitsandbytes' paged optimizers keep their states in CUDA unified memory (functional.py get_paged:
cudaMallocManaged), which the driver pages out to host RAM when the card fills: they show on nvidia-smi while
resident but never make a run run out of memory (the QLoRA paper's "paged optimizers")."""
from memfit.roles.estimate import estimate

GiB = 2**30
# torchtune's README (2024-04): Llama-2-7B full fine-tune with PagedAdamW on one RTX 4090 ran (cases/
# torchtune-readme-2024-04-3)
RUN = dict(model="meta-llama/Llama-2-7b-hf", gpu="rtx4090", profile="torchtune", tuning="full", micro_batch=2,
           seq_len=2048, checkpointing="full", optimizer_in_backward=True)


def test_paged_states_count_on_the_card_but_not_against_its_capacity(scenario):
    paged = estimate(scenario(optimizer="paged-adamw-8bit", **RUN))
    group = paged.group()
    assert group.evictable > 10 * GiB  # 8-bit states of 6.7B parameters
    assert paged.device_total.peak.get("optimizer_states") >= group.evictable  # nvidia-smi shows them resident
    assert paged.device_total.peak.total > paged.scenario.hardware.gpu.memory_bytes
    assert paged.margin_bytes == group.capacity - group.peak + group.evictable > 0
    assert paged.verdict != "oom"
    assert any("cudaMallocManaged" in a for a in paged.assumptions)


def test_the_same_states_unpaged_do_not_fit(scenario):
    plain = estimate(scenario(optimizer="adamw-8bit", **RUN))
    assert plain.group().evictable == 0
    assert plain.verdict == "oom"
