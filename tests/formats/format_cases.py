"""The example files and, for each, the changes its format can say (shared by the format tests)."""
from pathlib import Path

EXAMPLES = Path(__file__).parent / "examples"

# file (under examples/) -> (read options, changes that file's format can say)
CASES = {
    "deepspeed/ds_config_explicit.json": ({}, {"zero_stage": 2, "ratio": None, "pin_memory": True,
                                               "overlap_comm": False, "micro_batch": 1, "grad_accum": 8}),
    "llamafactory/examples/deepspeed/ds_z3_config.json": ({}, {"offload_optimizer": "cpu", "pin_memory": False,
                                                                "reduce_bucket_size": 200_000_000}),
    "llamafactory/examples/deepspeed/ds_z2_config.json": ({}, {"zero_stage": 3, "overlap_comm": True,
                                                                "grad_accum_dtype": "fp32"}),
    "llamafactory/examples/train_lora/llama3_lora_sft.yaml": ({"gpus": 7}, {
        "micro_batch": 2, "grad_accum": 4, "checkpointing": "unsloth", "attention": "sdpa", "loss": "liger",
        "lora_rank": 32, "seq_len": 4096}),
    "llamafactory/examples/train_lora/llama3_lora_sft_ds3.yaml": ({}, {
        "offload_optimizer": "cpu", "pin_memory": False, "micro_batch": 4, "checkpointing": "off"}),
    "llamafactory/examples/train_lora/llama31_8b_lora_7x4090.yaml": ({"gpus": 7}, {
        "engine": "deepspeed", "zero_stage": 3, "micro_batch": 1, "grad_accum": 16}),
    "llamafactory/examples/train_full/llama3_full_sft.yaml": ({}, {
        "zero_stage": 2, "tuning": "lora", "lora_rank": 16, "precision": "bf16-mixed", "padding": "packed"}),
    "llamafactory/examples/train_qlora/llama3_lora_sft_otfq.yaml": ({}, {"tuning": "lora", "optimizer": "paged-adamw-8bit"}),
    "llamafactory/examples/train_lora/llama3_lora_dpo.yaml": ({}, {"lora_rank": 16, "attention": "eager"}),
    "openrlhf/train_sft_llama_v0.8.sh": ({"gpus": 8, "version": "0.8.9"}, {
        "zero_stage": 3, "offload_optimizer": "cpu", "attention": "eager", "micro_batch": 1, "grad_accum": 32,
        "tuning": "lora", "lora_rank": 16, "padding": "padding_free"}),
    "openrlhf/train_sft_llama_v0.9.sh": ({}, {"offload_optimizer": "cpu", "checkpointing": "off", "seq_len": 2048,
                                              "padding": "padded", "attention": "sdpa", "precision": "fp16-mixed"}),
    "openrlhf/train_sft_v0.11.sh": ({"gpus": 8}, {"zero_stage": 3, "offload_optimizer": "cpu", "micro_batch": 1,
                                                   "grad_accum": 32, "loss": "liger", "grad_accum_dtype": "fp32"}),
    "openrlhf/train_sft_mixtral_lora_v0.11.sh": ({}, {"tuning": "full", "padding": "padded", "reentrant": True}),
    "openrlhf/train_dpo_v0.11.sh": ({}, {"offload_optimizer": "cpu", "seq_len": 4096, "attention": "eager",
                                         "ref_offload": True}),
    "openrlhf/glm4_9b_dpo_eager.sh": ({"gpus": 8}, {"attention": "flash", "ref_offload": True, "micro_batch": 2,
                                                    "grad_accum": 8}),
    "openrlhf/qwen2_7b_4x4090_z3.sh": ({}, {"offload_optimizer": "cpu", "micro_batch": 2, "grad_accum": 8}),
    "openrlhf/qwen25_72b_offload.sh": ({}, {"offload_optimizer": "none", "micro_batch": 2, "seq_len": 2048}),
    "openrlhf/one_line.txt": ({}, {"zero_stage": 3, "lora_rank": 8, "lora_targets": ("all-linear",),
                                   "checkpointing": "full"}),
    "accelerate/deepspeed_zero3.yaml": ({}, {"offload_optimizer": "cpu", "offload_param": "cpu", "zero3_init": False}),
    "accelerate/deepspeed_zero2_offload.yaml": ({}, {"zero_stage": 3, "offload_optimizer": "none", "grad_accum": 8}),
    "accelerate/deepspeed_config_file.yaml": ({}, {"pin_memory": True, "offload_param": "cpu", "ratio": 0.5}),
    "accelerate/fsdp_config.yaml": ({}, {"fsdp_cpu_offload": True, "fsdp_strategy": "shard_grad_op",
                                         "checkpointing": "full"}),
    "accelerate/fsdp2_config.yaml": ({}, {"fsdp_strategy": "shard_grad_op", "checkpointing": "off"}),
    "accelerate/multi_gpu.yaml": ({}, {"engine": "fsdp", "fsdp_cpu_offload": True}),
    "hf/sft_config.yaml": ({}, {"micro_batch": 1, "grad_accum": 16, "checkpointing": "off", "padding": "padding_free",
                                "loss": "chunked_nll", "tuning": "lora", "lora_rank": 16, "attention": "sdpa"}),
    "hf/sft_lora_config.yaml": ({}, {"tuning": "lora", "lora_targets": ("q_proj", "v_proj"), "precision": "bf16-pure",
                                     "seq_len": 1024}),
    "hf/dpo_config.yaml": ({}, {"precompute_ref_log_probs": True, "micro_batch": 2, "reentrant": True}),
    "hf/training_args.json": ({}, {"zero_stage": 3, "offload_optimizer": "cpu", "optimizer": "adamw-foreach",
                                   "micro_batch": 1}),
    "hf/training_args_fsdp.json": ({}, {"fsdp_cpu_offload": False, "checkpointing": "off", "micro_batch": 4}),
}
