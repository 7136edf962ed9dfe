# ProRL v2 (REINFORCE++-baseline, KL loss, long 8k-token answers) with a math reward function on 8 GPUs shared by
# actor, reference and 8 vLLM engines; dynamic batching by tokens. Dotted flags of OpenRLHF >= 0.10.2.
# Modelled on github.com/OpenRLHF/OpenRLHF examples/scripts/train_prorlv2_math_hybrid_engine.sh
# at commit 3c3be6234e0cb353e76bb8019947db9dfe99fca7 (its --algo.advantage.is_correction_* flags left out: 0.11.2
# renamed them, and they change no memory).
python3 -m openrlhf.cli.train_ppo_ray \
   --ref.num_nodes 1 --ref.num_gpus_per_node 8 \
   --actor.num_nodes 1 --actor.num_gpus_per_node 8 \
   --vllm.num_engines 8 \
   --vllm.tensor_parallel_size 1 \
   --train.colocate_all \
   --vllm.gpu_memory_utilization 0.75 \
   --vllm.enable_sleep \
   --ds.enable_sleep \
   --vllm.enforce_eager \
   --algo.kl.init_coef 1e-4 \
   --algo.kl.use_loss \
   --algo.kl.estimator k2 \
   --algo.advantage.estimator reinforce_baseline \
   --algo.dynamic_filtering_enable \
   --algo.dynamic_filtering_range 0 1 \
   --actor.eps_clip_low_high 0.2 0.27 \
   --actor.model_name_or_path deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B \
   --reward.remote_url /openrlhf/examples/python/math_reward_func.py \
   --train.batch_size 1024 \
   --rollout.batch_size 512 \
   --rollout.n_samples_per_prompt 16 \
   --train.dynamic_batch_enable \
   --train.max_tokens_per_gpu 32768 \
   --data.max_len 9216 \
   --rollout.max_new_tokens 8192 \
   --ds.zero_stage 3 \
   --ds.param_dtype bf16 \
   --data.prompt_dataset OpenRLHF/dapo-math-17k \
   --data.apply_chat_template \
   --actor.gradient_checkpointing_enable \
   --ds.packing_samples
