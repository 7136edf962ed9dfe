# Follows huggingface/alignment-handbook recipes/zephyr-7b-beta/README.md (commit dbcda4389830bace7b00bf63bad1d1c2af928a86):
# QLoRA SFT on one GPU of the multi_gpu config (--num_processes=1), flags after the recipe override it.
ACCELERATE_LOG_LEVEL=info accelerate launch --config_file recipes/accelerate_configs/multi_gpu.yaml --num_processes=1 \
    scripts/sft.py --config recipes/zephyr-7b-beta/sft/config_qlora.yaml --load_in_4bit=true
