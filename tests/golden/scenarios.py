"""A fixed sample of runs, written as `memfit` command-line arguments (the user-facing API), so the golden
estimates outlive any internal change. A seeded sampler draws knob values from pools; runs memfit refuses are
dropped when the golden file is recorded, so the file holds only accepted runs.
"""
from __future__ import annotations

import random

MODELS = ["llama3.1-8b", "Qwen/Qwen2-7B", "gemma2-9b", "glm4-9b", "mistralai/Mixtral-8x7B-Instruct-v0.1",
          "deepseek-v2-lite", "tiiuae/falcon-7b", "bigscience/bloomz-7b1", "bigcode/starcoder2-3b",
          "bigcode/gpt_bigcode-santacoder", "llama3.2-1b", "google/gemma-3-4b-it", "Qwen/Qwen3-1.7B",
          "microsoft/Phi-3-mini-4k-instruct", "internlm/internlm2_5-7b-chat", "Qwen/Qwen2.5-72B",
          "Qwen/Qwen3-30B-A3B", "allenai/OLMo-2-1124-7B", "TheBloke/Mistral-7B-v0.1-GPTQ", "Qwen/Qwen-7B"]
GPUS = [("rtx4090", "1"), ("rtx4090", "4"), ("a100-80gb", "8"), ("a100-40gb", "2"), ("h100-sxm", "8"),
        ("rtx3090", "2"), ("v100-32gb", "4")]
PROFILES = ["hf-trainer", "trl", "peft-loop", "llamafactory", "openrlhf", "torchtune", "litgpt", "unsloth"]
ENGINES = [[], ["--engine", "ddp"], ["--zero", "0"], ["--zero", "1"], ["--zero", "2"], ["--zero", "3"],
           ["--zero", "2", "--offload-optimizer", "cpu"], ["--zero", "3", "--offload-optimizer", "cpu"],
           ["--zero", "3", "--offload-optimizer", "cpu", "--no-pin-memory"],
           ["--zero", "3", "--offload-optimizer", "cpu", "--ratio", "0.7", "--sub-group-size", "100000000"],
           ["--zero", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu"],
           ["--zero", "1", "--offload-optimizer", "cpu", "--overlap-comm"],
           ["--zero", "2", "--grad-accum-dtype", "fp32"],
           ["--fsdp", "full_shard"], ["--fsdp", "shard_grad_op"], ["--fsdp", "full_shard", "--fsdp-offload"],
           ["--fsdp", "hybrid_shard", "--nodes", "2"]]
TUNINGS = [["--tuning", "full"], ["--tuning", "lora"], ["--tuning", "lora", "--lora-rank", "64"],
           ["--tuning", "lora", "--dora", "--lora-targets", "q_proj,v_proj"], ["--tuning", "qlora"],
           ["--tuning", "freeze", "--freeze-trainable-layers", "4"], ["--tuning", "lora", "--lora-dropout", "0.1"]]
CKPTS = [[], ["--ckpt"], ["--ckpt", "off"], ["--ckpt", "every_n", "--ckpt-every", "2"], ["--ckpt", "offload"],
         ["--ckpt", "unsloth"]]
ATTNS = [[], ["--attn", "eager"], ["--attn", "sdpa"], ["--attn", "flash"]]
LOSSES = [[], ["--loss", "liger"], ["--loss", "chunked_nll"], ["--loss", "chunked_output"]]
PADS = [[], ["--padding", "packed"], ["--padding", "padding_free"]]
PRECISIONS = [[], ["--precision", "bf16-mixed"], ["--precision", "bf16-pure"], ["--precision", "fp16-mixed"],
              ["--precision", "fp32"]]
OPTIMIZERS = [[], ["--optimizer", "adamw-foreach"], ["--optimizer", "adamw-8bit"], ["--optimizer", "paged-adamw-8bit"],
              ["--optimizer", "adafactor"], ["--optimizer", "sgd"], ["--optimizer", "adamw-loop"]]
BATCH = [["--micro-batch", "1", "--seq", "512"], ["--micro-batch", "4", "--seq", "2048"],
         ["--micro-batch", "2", "--seq", "4096", "--grad-accum", "8"], ["--micro-batch", "8", "--seq", "128"],
         ["--micro-batch", "1", "--seq", "8192"]]
HOST = [[], ["--host-ram", "512GB"], ["--host-ram", "1.4TB"]]
SEVERAL = [["--method", "dpo"], ["--method", "ipo"], ["--method", "kto"], ["--method", "orpo"], ["--method", "simpo"],
           ["--method", "rm"], ["--method", "dpo", "--ref-offload"], ["--method", "dpo", "--precompute-ref"],
           ["--method", "ppo"], ["--method", "grpo"], ["--method", "ppo", "--colocate", "all", "--vllm-sleep"],
           ["--method", "grpo", "--colocate", "all", "--ds-sleep", "--vllm-mem", "0.6"],
           ["--method", "ppo", "--colocate", "actor-ref+critic-reward", "--remote-reward"],
           ["--method", "ppo", "--role-gpus", "actor=4,critic=2,ref=1,reward=1", "--vllm-engines", "0"],
           ["--method", "grpo", "--init-kl-coef", "0", "--rollout-micro-batch", "4"]]


def sample(n_single: int = 320, n_several: int = 120, seed: int = 10) -> list[list[str]]:
    rng = random.Random(seed)
    out = []
    for i in range(n_single + n_several):
        gpu, gpus = rng.choice(GPUS)
        args = [rng.choice(MODELS), "--gpu", gpu, "--gpus", gpus, "--profile", rng.choice(PROFILES)]
        for pool in (ENGINES, TUNINGS, CKPTS, ATTNS, LOSSES, PADS, PRECISIONS, OPTIMIZERS, BATCH, HOST):
            args += rng.choice(pool)
        if i >= n_single:
            args += rng.choice(SEVERAL)
        out.append(args)
    return out


# Plans: the user reports' shapes and a few more (each search takes up to a second).
PLANS = [
    ["Qwen/Qwen2-7B", "--gpu", "rtx4090", "--gpus", "4", "--profile", "openrlhf", "--tuning", "full", "--zero", "3",
     "--micro-batch", "4", "--seq", "128", "--ckpt", "--attn", "flash", "--allow", "lora"],
    ["glm4-9b", "--gpu", "a100-80gb", "--gpus", "8", "--profile", "openrlhf", "--method", "dpo", "--zero", "3",
     "--micro-batch", "1", "--seq", "2048", "--ckpt", "--attn", "eager"],
    ["Qwen/Qwen2.5-72B", "--gpu", "a100-80gb", "--gpus", "8", "--profile", "openrlhf", "--zero", "3",
     "--offload-optimizer", "cpu", "--host-ram", "1.4TB", "--micro-batch", "1", "--seq", "2048", "--ckpt"],
    ["llama3.1-8b", "--gpu", "rtx4090", "--gpus", "7", "--profile", "llamafactory", "--tuning", "lora",
     "--micro-batch", "4", "--seq", "2048", "--precision", "bf16-mixed"],
    ["llama3.1-8b", "--gpu", "a100-80gb", "--gpus", "1", "--profile", "hf-trainer", "--tuning", "full",
     "--micro-batch", "8", "--seq", "4096", "--allow", "lora,qlora,8bit"],
    ["gemma2-9b", "--gpu", "rtx4090", "--gpus", "2", "--profile", "trl", "--tuning", "full", "--micro-batch", "2",
     "--seq", "2048", "--global-batch", "32"],
    ["Qwen/Qwen3-30B-A3B", "--gpu", "h100-sxm", "--gpus", "8", "--profile", "llamafactory", "--zero", "3",
     "--micro-batch", "2", "--seq", "4096"],
    ["Qwen/Qwen2-7B", "--gpu", "a100-80gb", "--gpus", "8", "--profile", "openrlhf", "--method", "ppo",
     "--colocate", "all", "--zero", "3", "--micro-batch", "2", "--seq", "1024"],
    ["llama3.2-1b", "--gpu", "rtx3090", "--gpus", "1", "--profile", "unsloth", "--tuning", "qlora",
     "--micro-batch", "16", "--seq", "2048"],
    ["mistralai/Mixtral-8x7B-Instruct-v0.1", "--gpu", "a100-80gb", "--gpus", "8", "--profile", "torchtune",
     "--tuning", "lora", "--micro-batch", "4", "--seq", "4096"],
]
