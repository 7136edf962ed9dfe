# PPO on 16 GPUs without colocate-all: actor+reference on 4, critic+reward on 4, 4 vLLM engines x TP 2 on 8;
# Adam states offloaded to the host; dotted flags of OpenRLHF >= 0.10.2.
# Modelled on github.com/OpenRLHF/OpenRLHF examples/scripts/train_ppo_ray_slurm.sh
# at commit 3c3be6234e0cb353e76bb8019947db9dfe99fca7 (the ray job inside its srun, without the Slurm setup).
ray job submit --address=http://localhost:8265 \
    -- python3 -m openrlhf.cli.train_ppo_ray \
    --ref.num_nodes 1 --ref.num_gpus_per_node 4 \
    --reward.num_nodes 1 --reward.num_gpus_per_node 4 \
    --critic.num_nodes 1 --critic.num_gpus_per_node 4 \
    --actor.num_nodes 1 --actor.num_gpus_per_node 4 \
    --vllm.num_engines 4 \
    --vllm.tensor_parallel_size 2 \
    --train.colocate_critic_reward \
    --train.colocate_actor_ref \
    --actor.model_name_or_path OpenRLHF/Llama-3-8b-sft-mixture \
    --reward.model_name_or_path OpenRLHF/Llama-3-8b-rm-mixture \
    --train.micro_batch_size 8 \
    --train.batch_size 128 \
    --rollout.micro_batch_size 16 \
    --rollout.batch_size 1024 \
    --data.max_len 2048 \
    --ds.zero_stage 3 \
    --ds.param_dtype bf16 \
    --algo.kl.init_coef 0.01 \
    --data.prompt_dataset OpenRLHF/prompt-collection-v0.1 \
    --data.apply_chat_template \
    --ds.adam_offload \
    --ds.packing_samples \
    --actor.gradient_checkpointing_enable
