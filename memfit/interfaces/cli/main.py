"""`memfit` command line: parse arguments into a Scenario, run a job, hand the result to rendering.

Every bad input becomes one line on stderr and exit code 2 (MemfitError); nothing here computes memory.
"""
from __future__ import annotations

import argparse
import re
import sys

from memfit.errors import MemfitError

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "p": 1e15, "pb": 1e15, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str, what: str) -> int:
    """'24GiB', '80GB', '1.4TB', '512MiB' or plain bytes -> bytes (GB = 1e9, GiB = 2^30)."""
    m = _SIZE.match(str(text))
    unit = (m.group(2) or "").lower() if m else None
    if not m or unit not in _UNITS:
        raise MemfitError(f"{what} {text!r} is not a size; write e.g. 24GiB, 80GB or 1.4TB")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise MemfitError(f"{what} must be positive, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's multi-line usage dump -> one line, exit 2
        raise MemfitError(f"{self.prog}: {message}")


def _int(text: str) -> int:
    try:
        return int(float(text)) if re.fullmatch(r"-?[0-9.]+(e[0-9]+)?", text, re.I) else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def add_scenario_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="hub id, alias, or a local config.json / folder holding one")
    p.add_argument("--from", dest="from_file", help="read the knobs from a framework file: DeepSpeed JSON, "
                   "LLaMA-Factory YAML, OpenRLHF command, accelerate YAML, HF/TRL config (flags given here win)")
    hw = p.add_argument_group("hardware")
    hw.add_argument("--gpu", help="GPU from `memfit gpus` (e.g. rtx4090, a100-80gb, h100)")
    hw.add_argument("--gpu-mem", help="usable memory of a GPU not in the catalog, e.g. 24GiB")
    hw.add_argument("--gpus", type=_int, default=1, help="GPUs per node (default 1)")
    hw.add_argument("--nodes", type=_int, default=1)
    hw.add_argument("--host-ram", help="host RAM per node, e.g. 1.4TB (enables the host verdict)")
    t = p.add_argument_group("training")
    t.add_argument("--profile",
                   help="framework defaults: hf-trainer, trl, peft-loop, llamafactory, openrlhf, torchtune, litgpt, unsloth")
    t.add_argument("--tuning", choices=["full", "freeze", "lora", "qlora"])
    t.add_argument("--lora-rank", type=_int)
    t.add_argument("--lora-alpha", type=_int)
    t.add_argument("--lora-targets", help="comma-separated module names or roles, or all-linear")
    t.add_argument("--lora-dropout", type=float)
    t.add_argument("--dora", action="store_true", default=None)
    t.add_argument("--freeze-trainable-layers", type=_int)
    t.add_argument("--precision", help="bf16-mixed, fp16-mixed, bf16-pure, fp16-pure, fp32")
    t.add_argument("--adapter-dtype", help="fp32 (PEFT default) or bf16")
    t.add_argument("--optimizer", help="adamw-fused, adamw-foreach, adamw-loop, adamw-8bit, paged-adamw-8bit, "
                                       "paged-adamw-32bit, sgd, adafactor")
    t.add_argument("--micro-batch", type=_int)
    t.add_argument("--seq", type=_int, help="sequence length (the longest row of a padded batch)")
    t.add_argument("--grad-accum", type=_int)
    t.add_argument("--ckpt", nargs="?", const="full", help="gradient checkpointing: off, full, every_n, offload, unsloth")
    t.add_argument("--ckpt-every", type=_int)
    t.add_argument("--reentrant", action="store_true", default=None)
    t.add_argument("--attn", help="eager, sdpa, flash")
    t.add_argument("--padding", help="padded, packed, padding_free")
    t.add_argument("--loss", help="standard, liger, chunked_nll, chunked_output")
    t.add_argument("--bnb-saves-input", action="store_true", default=None,
                   help="bitsandbytes < 0.43.2: every 4-bit Linear keeps its input for backward")
    t.add_argument("--kbit-upcast", action="store_true", default=None,
                   help="PEFT prepare_model_for_kbit_training (QLoRA): non-4-bit params to fp32")
    e = p.add_argument_group("engine")
    e.add_argument("--engine", help="single, ddp, deepspeed, fsdp")
    e.add_argument("--zero", type=_int, help="DeepSpeed ZeRO stage 0-3")
    e.add_argument("--offload-optimizer", help="none, cpu, nvme")
    e.add_argument("--offload-param", help="none, cpu, nvme")
    e.add_argument("--ratio", type=float, help="DeepSpeed offload_optimizer.ratio (ZeRO-3)")
    e.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=None)
    e.add_argument("--reduce-bucket-size", type=_int)
    e.add_argument("--overlap-comm", action=argparse.BooleanOptionalAction, default=None)
    e.add_argument("--prefetch-bucket-size", type=_int)
    e.add_argument("--persistence-threshold", type=_int)
    e.add_argument("--sub-group-size", type=_int)
    e.add_argument("--grad-accum-dtype")
    e.add_argument("--fsdp", help="full_shard, shard_grad_op, hybrid_shard, no_shard")
    e.add_argument("--fsdp-offload", action="store_true", default=None)
    # issue 6: preference / RL runs with several models (memfit/roles/estimate.py, catalog/methods.toml)
    r = p.add_argument_group("preference / RL (several models; OpenRLHF legacy and dotted flags in --help text)")
    r.add_argument("--method", help="sft, pt, dpo, ipo, kto, orpo, simpo, rm, ppo, grpo")
    r.add_argument("--ref-model", help="reference model if not the policy's (--ref_pretrain / --ref.model_name_or_path)")
    r.add_argument("--precompute-ref", action="store_true", default=None, help="TRL precompute_ref_log_probs")
    r.add_argument("--ref-offload", action="store_true", default=None, help="--ref_offload / --ref.offload (ZeRO-3 only)")
    r.add_argument("--reward-model", help="PPO/GRPO reward model (--reward_pretrain / --reward.model_name_or_path)")
    r.add_argument("--reward-offload", action="store_true", default=None, help="--reward.offload (ZeRO-3 only)")
    r.add_argument("--remote-reward", action="store_true", default=None, help="--remote_rm_url: no reward model")
    r.add_argument("--critic-model", help="PPO critic (--critic_pretrain; default: the reward model)")
    r.add_argument("--init-kl-coef", type=float, help="--init_kl_coef / --algo.kl.init_coef; 0 = no reference")
    r.add_argument("--colocate", help="none, actor-ref, critic-reward, actor-ref+critic-reward, all "
                                      "(--colocate_actor_ref / --train.colocate_actor_ref, --colocate_all_models / "
                                      "--train.colocate_all)")
    r.add_argument("--vllm-engines", type=_int, help="--vllm_num_engines / --vllm.num_engines (0 = no vLLM)")
    r.add_argument("--vllm-tp", type=_int, help="--vllm_tensor_parallel_size / --vllm.tensor_parallel_size")
    r.add_argument("--vllm-mem", type=float, help="--vllm_gpu_memory_utilization / --vllm.gpu_memory_utilization")
    r.add_argument("--vllm-sleep", action="store_true", default=None, help="--vllm_enable_sleep / --vllm.enable_sleep")
    r.add_argument("--ds-sleep", action="store_true", default=None,
                   help="--deepspeed_enable_sleep / --ds.enable_sleep")
    r.add_argument("--rollout-micro-batch", type=_int, help="--micro_rollout_batch_size / --rollout.micro_batch_size")
    r.add_argument("--role-gpus", help="GPUs per role group when not colocated, e.g. actor=4,critic=2,ref=1,reward=1")


def scenario_from_args(a: argparse.Namespace):
    from memfit.facts.catalog import custom_gpu, find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware

    if not a.gpu and not a.gpu_mem:
        raise MemfitError("say which GPU: --gpu NAME (see `memfit gpus`) or --gpu-mem 24GiB")
    gpu = find_gpu(a.gpu) if a.gpu else None
    if a.gpu_mem:
        gpu = custom_gpu(parse_size(a.gpu_mem, "--gpu-mem"), like=gpu)
    host = parse_size(a.host_ram, "--host-ram") if a.host_ram else None
    hardware = Hardware(gpu=gpu, gpus_per_node=a.gpus, nodes=a.nodes, host_ram_bytes=host)
    knobs = {
        "tuning": a.tuning, "lora_rank": a.lora_rank, "lora_alpha": a.lora_alpha,
        "lora_targets": tuple(x.strip() for x in a.lora_targets.split(",")) if a.lora_targets else None,
        "lora_dropout": a.lora_dropout, "dora": a.dora, "freeze_trainable_layers": a.freeze_trainable_layers,
        "precision": a.precision, "adapter_dtype": a.adapter_dtype, "optimizer": a.optimizer,
        "micro_batch": a.micro_batch, "seq_len": a.seq, "grad_accum": a.grad_accum,
        "checkpointing": a.ckpt, "checkpoint_every_n": a.ckpt_every, "reentrant": a.reentrant,
        "attention": a.attn, "padding": a.padding, "loss": a.loss, "kbit_upcast": a.kbit_upcast,
        "bnb_saves_input": a.bnb_saves_input,
        "engine": a.engine, "zero_stage": a.zero, "offload_optimizer": a.offload_optimizer,
        "offload_param": a.offload_param, "ratio": a.ratio, "pin_memory": a.pin_memory,
        "reduce_bucket_size": a.reduce_bucket_size, "overlap_comm": a.overlap_comm,
        "prefetch_bucket_size": a.prefetch_bucket_size, "param_persistence_threshold": a.persistence_threshold,
        "sub_group_size": a.sub_group_size, "grad_accum_dtype": a.grad_accum_dtype,
        "fsdp_strategy": a.fsdp, "fsdp_cpu_offload": a.fsdp_offload,
    }
    knobs |= _rl_knobs(a)  # issue 6: preference / RL knobs
    if a.ckpt_every and not a.ckpt:
        knobs["checkpointing"] = "every_n"
    profile = a.profile
    if a.from_file:
        from memfit.interfaces.formats import read_config

        imported = read_config(a.from_file, gpus=hardware.world_size)
        knobs = imported.knobs | {k: v for k, v in knobs.items() if v is not None}
        profile = profile or imported.profile
        a.model = a.model or imported.model_name
    if not a.model:
        raise MemfitError("say which model: a hub id or alias (see `memfit models`), or a file naming one with --from")
    return build_scenario(find_model(a.model), hardware, knobs, profile or "hf-trainer")


def _rl_knobs(a: argparse.Namespace) -> dict:
    """The preference / RL flags as Scenario knobs (RlConfig fields; scenario.rl_from_knobs)."""
    gpus = None
    if getattr(a, "role_gpus", None):
        try:
            gpus = {k.strip(): int(v) for k, v in (x.split("=") for x in a.role_gpus.split(","))}
        except ValueError:
            raise MemfitError(f"--role-gpus {a.role_gpus!r}: write role=N pairs, e.g. actor=4,critic=2") from None
    return {"method": getattr(a, "method", None), "ref_model": getattr(a, "ref_model", None),
            "precompute_ref_log_probs": getattr(a, "precompute_ref", None), "ref_offload": getattr(a, "ref_offload", None),
            "reward_model": getattr(a, "reward_model", None), "reward_offload": getattr(a, "reward_offload", None),
            "remote_reward": getattr(a, "remote_reward", None), "critic_model": getattr(a, "critic_model", None),
            "init_kl_coef": getattr(a, "init_kl_coef", None), "colocate": getattr(a, "colocate", None),
            "vllm_engines": getattr(a, "vllm_engines", None), "vllm_tp": getattr(a, "vllm_tp", None),
            "vllm_gpu_memory_utilization": getattr(a, "vllm_mem", None), "vllm_sleep": getattr(a, "vllm_sleep", None),
            "deepspeed_sleep": getattr(a, "ds_sleep", None),
            "rollout_micro_batch": getattr(a, "rollout_micro_batch", None), "role_gpus": gpus}


def _cmd_estimate(a) -> int:
    from memfit.memory.estimate import estimate

    s = scenario_from_args(a)
    if s.method not in ("sft", "pt"):  # issue 6: several models (policy, reference, critic, reward, vLLM)
        from memfit.roles.estimate import estimate_roles as estimate
    result = estimate(s)
    if a.json:
        import json

        print(json.dumps(result.to_json(), indent=2))
    else:
        from memfit.interfaces.render.tables import print_estimate

        print_estimate(result)
        if hasattr(result, "groups"):  # issue 6: per-role and per-GPU-group tables
            from memfit.interfaces.render.roles import print_roles

            print_roles(result)
    return 0


def _cmd_trace(a) -> int:
    from memfit.trace import render, run_trace, write_timeline

    scenario = scenario_from_args(a)
    result = run_trace(scenario, steps=a.steps)
    if a.timeline:
        write_timeline(result, a.timeline)
    if a.json:
        import json

        print(json.dumps(result.to_json(timeline=False), indent=2))
    else:
        from rich.console import Console

        console = Console()
        render(result, console)
        gpu = scenario.hardware.gpu
        peak = result.profile.peak.total
        if peak > gpu.memory_bytes:
            console.print(f"[bold red]OOM[/]: the traced tensors alone ({peak / 2**30:.2f} GiB allocated, before the "
                          f"allocator cache and CUDA context) exceed {gpu.name}'s {gpu.memory_bytes / 2**30:.2f} GiB")
        else:
            console.print(f"traced allocated peak {peak / 2**30:.2f} GiB of {gpu.name}'s "
                          f"{gpu.memory_bytes / 2**30:.2f} GiB (`memfit estimate` adds cache, context and NCCL)")
        if a.compare:
            from memfit.memory.estimate import estimate
            from memfit.interfaces.render.tables import print_comparison

            if scenario.method not in ("sft", "pt"):  # DPO: policy + reference on one GPU (issue 6)
                from memfit.roles.estimate import estimate_roles as estimate
            print_comparison(estimate(scenario).allocated, result.profile, "trace")
    return 0


def _cmd_measure(a) -> int:
    from memfit.measure import render, run_measure

    scenario = scenario_from_args(a)
    result = run_measure(scenario, steps=a.steps, model_dir=a.weights)
    if a.json:
        import json

        print(json.dumps(result.to_json(), indent=2))
        return 0
    from rich.console import Console

    from memfit.memory.estimate import estimate
    from memfit.interfaces.render.tables import print_comparison

    render(result, Console())
    if scenario.method not in ("sft", "pt"):  # DPO: the policy and reference engines (issue 6)
        from memfit.roles.estimate import estimate_roles as estimate
    worst = max(result.ranks, key=lambda r: r.device.peak.total)
    print_comparison(estimate(scenario).allocated, worst.device, "measured (worst rank)")
    return 0


def _cmd_models(a) -> int:
    from memfit.facts.catalog import models
    from memfit.memory.inventory import count_params
    from memfit.interfaces.render.tables import print_table

    key = (a.filter or "").lower()
    rows = [(m.id, m.arch, f"{count_params(m) / 1e9:.2f}B", ", ".join(m.aliases[:3]))
            for m in models() if key in m.id.lower() or key in m.arch or any(key in x for x in m.aliases)]
    print_table("models", ("id", "family", "params", "aliases"), rows)
    return 0


def _cmd_gpus(a) -> int:
    from memfit.facts.catalog import gpus
    from memfit.interfaces.render.tables import print_table

    key = (a.filter or "").lower()
    rows = [(g.id, g.name, f"{g.memory_bytes / 2**30:.2f} GiB", f"{g.bf16_tflops:g}", f"{g.memory_bandwidth_gbps:g}",
             g.interconnect) for g in gpus() if key in g.id.lower() or key in g.name.lower()]
    print_table("gpus", ("id", "name", "usable memory", "bf16 TFLOP/s", "GB/s", "interconnect"), rows)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="memfit", description="Will this fine-tuning run fit in GPU and host memory?")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    est = sub.add_parser("estimate", help="predict per-GPU and host memory, with a breakdown and a verdict")
    add_scenario_arguments(est)
    est.add_argument("--json", action="store_true", help="print the documented JSON document instead of tables")
    est.set_defaults(run=_cmd_estimate)
    tr = sub.add_parser("trace", help="run the real transformers/PEFT step on fake tensors (needs memfit[trace])")
    add_scenario_arguments(tr)
    tr.add_argument("--steps", type=_int, default=2, help="training steps; the last one is reported (default 2)")
    tr.add_argument("--timeline", help="write the allocation timeline to this JSON file")
    tr.add_argument("--compare", action="store_true", help="also print memfit's analytic estimate beside the trace")
    tr.add_argument("--json", action="store_true")
    tr.set_defaults(run=_cmd_trace)
    me = sub.add_parser("measure", help="run real steps on the real engine (needs memfit[measure]; CUDA or CPU+gloo)")
    add_scenario_arguments(me)
    me.add_argument("--steps", type=_int, default=3, help="training steps before the checkpoint save and resume")
    me.add_argument("--weights", help="a local folder with real weights (default: random init from the catalog)")
    me.add_argument("--json", action="store_true")
    me.set_defaults(run=_cmd_measure)
    from memfit.interfaces.cli.fit import add_fit_command
    from memfit.interfaces.cli.plan import add_plan_command

    add_plan_command(sub)
    add_fit_command(sub)
    for name, fn in (("models", _cmd_models), ("gpus", _cmd_gpus)):
        sp = sub.add_parser(name, help=f"list the {name} catalog")
        sp.add_argument("filter", nargs="?", help="substring to filter by")
        sp.set_defaults(run=fn)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except MemfitError as e:
        print(f"memfit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
