# Follows huggingface/alignment-handbook recipes/zephyr-7b-beta/README.md (commit dbcda4389830bace7b00bf63bad1d1c2af928a86):
# the full DPO step, the recipe given as the script's first word, with ZeRO-3, from the repository root.
ACCELERATE_LOG_LEVEL=info accelerate launch --config_file recipes/accelerate_configs/deepspeed_zero3.yaml \
    scripts/dpo.py recipes/zephyr-7b-beta/dpo/config_full.yaml
