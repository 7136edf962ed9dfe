"""`memfit doctor LOG` on a pasted error alone: the first line is the answer (what ran out, in which phase, the
size asked against what was free), then ranked fixes from what the log says (memfit/facts/data/log_fixes.toml),
then the config to ask for; every line fits 80 columns. The phase of DeepSpeed's start-up and of the optimizer
step read from the tracebacks those print (frames as the named library versions have them), whole or pasted
without their header; with a config, the card's capacity taken from the log.

Messages are PyTorch 2.2+'s (c10/cuda/CUDACachingAllocator.cpp), figures as a run on that card prints them."""
import json
import re
import shlex
from pathlib import Path

import pytest

from memfit.interfaces.cli.main import main
from memfit.interfaces.logs import parse_log
from memfit.interfaces.logs.advice import headline, table

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
GiB = 2**30
SITE = "/usr/local/lib/python3.10/dist-packages"
HINT = ("If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "to avoid fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def oom(tried, total, free, in_use, allocated, unallocated, gpu=0):
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried}. GPU {gpu} has a total capacity "
            f"of {total} of which {free} is free. Including non-PyTorch memory, this process has {in_use} memory "
            f"in use. Of the allocated memory {allocated} is allocated by PyTorch, and {unallocated} is reserved "
            f"by PyTorch but unallocated. {HINT}")


def frames(*rows) -> str:
    """Traceback body lines: (file under site-packages or absolute, line, function, source)."""
    out = []
    for file, line, func, source in rows:
        path = file if file.startswith("/") else f"{SITE}/{file}"
        out += [f'  File "{path}", line {line}, in {func}', f"    {source}"]
    return "\n".join(out)


def traceback(*rows, message: str) -> str:
    return "Traceback (most recent call last):\n" + frames(*rows) + "\n" + message


TRAIN = [("/workspace/train.py", 112, "<module>", "main()"),
         ("/workspace/train.py", 98, "main", "trainer.train()"),
         ("transformers/trainer.py", 2241, "train", "return inner_training_loop(")]

# ---------------------------------------------------------------- the two shapes that had no phase

# DeepSpeed 0.14 ZeRO-2 under accelerate: the ZeRO optimizer's constructor flattens each group's 16-bit
# weights into one buffer (stage_1_and_2.py __init__ -> flatten_dense_tensors_aligned -> torch's flatten)
ZERO2_INIT = [
    *TRAIN,
    ("transformers/trainer.py", 2367, "_inner_training_loop",
     "model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)"),
    ("accelerate/accelerator.py", 1303, "prepare", "result = self._prepare_deepspeed(*args)"),
    ("accelerate/accelerator.py", 1779, "_prepare_deepspeed",
     "engine, optimizer, _, lr_scheduler = ds_initialize(**kwargs)"),
    ("deepspeed/__init__.py", 181, "initialize", "engine = DeepSpeedEngine(args=args,"),
    ("deepspeed/runtime/engine.py", 307, "__init__", "self._configure_optimizer(optimizer, model_parameters)"),
    ("deepspeed/runtime/engine.py", 1231, "_configure_optimizer",
     "self.optimizer = self._configure_zero_optimizer(basic_optimizer)"),
    ("deepspeed/runtime/engine.py", 1488, "_configure_zero_optimizer", "optimizer = DeepSpeedZeroOptimizer("),
    ("deepspeed/runtime/zero/stage_1_and_2.py", 341, "__init__", "self.flatten_dense_tensors_aligned("),
    ("deepspeed/runtime/zero/stage_1_and_2.py", 896, "flatten_dense_tensors_aligned",
     "return self.flatten(align_dense_tensors(tensor_list, alignment))"),
    ("torch/_utils.py", 524, "_flatten_dense_tensors", "return torch._C._nn.flatten_dense_tensors(tensors)"),
]
ZERO2_OOM = oom("14.96 GiB", "79.15 GiB", "12.31 GiB", "66.83 GiB", "64.99 GiB", "1.18 GiB")

# DeepSpeed 0.12 ZeRO-3 called directly: the optimizer creates its states at start-up with one step on zero
# gradients (stage3.py _initialize_optimizer_states -> _optimizer_step -> torch's AdamW)
ZERO3_INIT = [
    ("/workspace/train.py", 61, "main", "engine, optimizer, _, _ = deepspeed.initialize(model=model, config=cfg,"),
    ("deepspeed/__init__.py", 171, "initialize", "engine = DeepSpeedEngine(args=args,"),
    ("deepspeed/runtime/engine.py", 304, "__init__", "self._configure_optimizer(optimizer, model_parameters)"),
    ("deepspeed/runtime/engine.py", 1225, "_configure_optimizer",
     "self.optimizer = self._configure_zero_optimizer(basic_optimizer)"),
    ("deepspeed/runtime/engine.py", 1552, "_configure_zero_optimizer", "optimizer = DeepSpeedZeroOptimizer_Stage3("),
    ("deepspeed/runtime/zero/stage3.py", 362, "__init__", "self._setup_for_real_optimizer()"),
    ("deepspeed/runtime/zero/stage3.py", 473, "_setup_for_real_optimizer", "self.initialize_optimizer_states()"),
    ("deepspeed/runtime/zero/stage3.py", 1032, "initialize_optimizer_states", "self._optimizer_step(i)"),
    ("deepspeed/runtime/zero/stage3.py", 958, "_optimizer_step", "self.optimizer.step()"),
    ("torch/optim/optimizer.py", 373, "wrapper", "out = func(*args, **kwargs)"),
    ("torch/optim/optimizer.py", 76, "_use_grad", "ret = func(self, *args, **kwargs)"),
    ("torch/optim/adamw.py", 184, "step", "adamw("),
    ("torch/optim/adamw.py", 335, "adamw", "func("),
    ("torch/optim/adamw.py", 599, "_multi_tensor_adamw", "exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)"),
]
ZERO3_OOM = oom("7.45 GiB", "39.39 GiB", "5.21 GiB", "34.17 GiB", "32.03 GiB", "1.63 GiB")

# torch 2.6+: AdamW is Adam's subclass, its kernels adam.py's; the step through accelerate's optimizer wrapper
ADAM_STEP = [
    *TRAIN,
    ("transformers/trainer.py", 2599, "_inner_training_loop", "self.optimizer.step()"),
    ("accelerate/optimizer.py", 178, "step", "self.optimizer.step(closure)"),
    ("torch/optim/lr_scheduler.py", 140, "wrapper", "return func.__get__(opt, opt.__class__)(*args, **kwargs)"),
    ("torch/optim/optimizer.py", 493, "wrapper", "out = func(*args, **kwargs)"),
    ("torch/optim/optimizer.py", 91, "_use_grad", "ret = func(self, *args, **kwargs)"),
    ("torch/optim/adam.py", 244, "step", "adam("),
    ("torch/optim/adam.py", 876, "adam", "func("),
    ("torch/optim/adam.py", 694, "_multi_tensor_adam", "exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)"),
]
ADAM_OOM = oom("2.00 GiB", "23.64 GiB", "1.18 GiB", "22.45 GiB", "21.73 GiB", "292.00 MiB")

# DeepSpeed ZeRO-1 with bf16 runs BF16_Optimizer; its step calls DeepSpeed's FusedAdam kernel
BF16_STEP = [
    *TRAIN,
    ("transformers/trainer.py", 2480, "_inner_training_loop", "self.accelerator.backward(loss, **kwargs)"),
    ("accelerate/accelerator.py", 2188, "backward", "self.deepspeed_engine_wrapped.backward(loss, **kwargs)"),
    ("accelerate/utils/deepspeed.py", 175, "backward", "self.engine.step()"),
    ("deepspeed/runtime/engine.py", 2169, "step", "self._take_model_step(lr_kwargs)"),
    ("deepspeed/runtime/engine.py", 2075, "_take_model_step", "self.optimizer.step()"),
    ("deepspeed/runtime/bf16_optimizer.py", 279, "step", "self.optimizer.step()"),
    ("torch/optim/optimizer.py", 385, "wrapper", "out = func(*args, **kwargs)"),
    ("deepspeed/ops/adam/fused_adam.py", 191, "step", "multi_tensor_applier(self.multi_tensor_adam,"),
    ("deepspeed/ops/adam/multi_tensor_apply.py", 17, "__call__", "return op(self.chunk_size, noop_flag_buffer,"),
]
BF16_OOM = oom("3.74 GiB", "79.15 GiB", "1.96 GiB", "77.18 GiB", "71.90 GiB", "4.79 GiB")


def tail(rows, n):
    """The last n frames of a traceback as users paste them: no "Traceback" header."""
    return frames(*rows[-n:])


SHAPES = {
    "deepspeed-zero2-init": (traceback(*ZERO2_INIT, message=ZERO2_OOM), "load", "flat 16-bit buffers"),
    "deepspeed-zero2-init-pasted-tail": (tail(ZERO2_INIT, 3) + "\n" + ZERO2_OOM, "load", "flat 16-bit buffers"),
    "deepspeed-zero3-init-step": (traceback(*ZERO3_INIT, message=ZERO3_OOM), "load", "ZeRO optimizer init"),
    "torch-2.6-adam-step": (traceback(*ADAM_STEP, message=ADAM_OOM), "optimizer_step", "foreach Adam"),
    "torch-adamw-step-pasted-tail": (tail(ZERO3_INIT, 4) + "\n" + ZERO3_OOM, "optimizer_step", "AdamW"),
    "deepspeed-bf16-step": (traceback(*BF16_STEP, message=BF16_OOM), "optimizer_step", "BF16 optimizer step"),
    "deepspeed-bf16-step-pasted-tail": (tail(BF16_STEP, 4) + "\n" + BF16_OOM, "optimizer_step", "BF16"),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_phase_of_deepspeed_start_up_and_of_the_optimizer_step(name):
    text, phase, component = SHAPES[name]
    [f] = parse_log(text).failures
    assert f.phase == phase
    assert component in (f.component or ""), f.component


def test_zero3_repartitioning_after_a_layers_forward_stays_forward():
    # partition() runs at start-up and after each layer's forward: inside the forward it is the forward
    rows = [*TRAIN,
            ("transformers/trainer.py", 3612, "compute_loss", "outputs = model(**inputs)"),
            ("torch/nn/modules/module.py", 1562, "_call_impl", "result = forward_call(*args, **kwargs)"),
            ("deepspeed/runtime/zero/parameter_offload.py", 393, "_post_forward_module_hook",
             "self.post_sub_module_forward_function(module)"),
            ("deepspeed/runtime/zero/parameter_offload.py", 519, "post_sub_module_forward_function",
             "param_coordinator.release_sub_module(sub_module)"),
            ("deepspeed/runtime/zero/partitioned_param_coordinator.py", 410, "release_sub_module",
             "self.__release_param(param)"),
            ("deepspeed/runtime/zero/partition_parameters.py", 1196, "partition",
             "self._partition(param_list, has_been_updated=has_been_updated)"),
            ("deepspeed/runtime/zero/partition_parameters.py", 1345, "_partition_param",
             "param.ds_tensor = torch.empty(partition_size, dtype=param.dtype, device=device)")]
    [f] = parse_log(traceback(*rows, message=ADAM_OOM)).failures
    assert f.phase == "forward"


def test_a_pasted_tail_is_only_the_frames_right_above_the_error():
    # an earlier paste's frames (the optimizer step), a log line, then this error's one frame, which names no
    # phase: the earlier frames are not this error's
    text = tail(ADAM_STEP, 3) + "\n[INFO] retrying with a smaller bucket\n" + tail(ZERO2_INIT, 1) + "\n" + ZERO2_OOM
    [f] = parse_log(text).failures
    assert f.phase is None
    [f] = parse_log(tail(ADAM_STEP, 3) + "\n" + tail(ZERO2_INIT, 1) + "\n" + ZERO2_OOM).failures
    assert f.phase == "optimizer_step"  # the same frames unbroken are one traceback


# ---------------------------------------------------------------- the answer and the fixes, no config

def doctor(tmp_path, capsys, text, *args):
    log = tmp_path / "err.log"
    log.write_text(text)
    code = main(["doctor", str(log), *args])
    out = capsys.readouterr().out
    assert code == 0
    return log, out.splitlines()


def fixes(lines):
    return [re.sub(r"^ \d+\. ", "", x) for x in lines if re.match(r" \d+\. ", x)]


def fix_text(name):
    return table()["fix"][name]["text"]


BACKWARD = traceback(
    *TRAIN,
    ("transformers/trainer.py", 3661, "training_step", "self.accelerator.backward(loss, **kwargs)"),
    ("accelerate/accelerator.py", 2246, "backward", "loss.backward(**kwargs)"),
    ("torch/_tensor.py", 521, "backward", "torch.autograd.backward("),
    ("torch/autograd/__init__.py", 289, "backward", "_engine_run_backward("),
    ("torch/autograd/graph.py", 769, "_engine_run_backward", "return Variable._execution_engine.run_backward("),
    message=oom("1.96 GiB", "23.64 GiB", "1.02 GiB", "22.61 GiB", "22.10 GiB", "512.00 MiB"))


def test_the_first_line_is_the_answer_then_ranked_fixes_then_the_config_to_ask_for(tmp_path, capsys):
    log, lines = doctor(tmp_path, capsys, BACKWARD)
    assert lines[0] == "CUDA OOM in backward: asked 1.96 GiB with 1.02 GiB free of 23.64 GiB"
    assert lines[1].strip() == "(22.1 GiB allocated by PyTorch, 0.5 GiB reserved but unallocated)"
    got = fixes(lines)
    # the backward rule's order; 512 MiB unallocated is a quarter of the ask: the allocator hint comes last
    assert got == [fix_text(n) for n in ("checkpointing", "micro_batch", "flash_attention", "fused_loss")] + \
        ["PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]
    assert pasted(lines) == ["memfit", "doctor", str(log), "--from", "CONFIG"]


def pasted(lines: list[str]) -> list[str]:
    """The command after "next:" as a shell reads it pasted: a backslash-newline is removed, then words split."""
    start = max(i for i, x in enumerate(lines) if x.startswith("next: "))
    body = "\n".join(lines[start:])
    command = body[body.index("memfit "):]
    return shlex.split(command.replace("\\\n", ""))


def test_every_fix_names_the_flag_or_key_to_change():
    for name, row in table()["fix"].items():
        assert re.search(r"--[a-z]|[a-z_]+[:=]", row["text"]), name  # a memfit flag, a key: value or VAR=value
        assert len(row["text"]) <= 76, name  # " 1. " + the text fits 80 columns


def test_a_large_reserved_but_unallocated_puts_the_allocator_setting_first(tmp_path, capsys):
    # 2.30 GiB held by PyTorch in pieces, more than the 1.70 GiB asked: PyTorch's own hint is the fix
    text = BACKWARD.split("torch.OutOfMemoryError")[0] + oom("1.70 GiB", "23.64 GiB", "0.41 GiB", "23.22 GiB",
                                                              "20.62 GiB", "2.30 GiB")
    _, lines = doctor(tmp_path, capsys, text)
    got = fixes(lines)
    assert got[0] == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" and got[1] == fix_text("checkpointing")
    assert len(got) == len(set(got))  # the log's hint and the rule's are one fix


def test_logits_in_the_traceback_put_the_fused_loss_first(tmp_path, capsys):
    _, lines = doctor(tmp_path, capsys, (HERE / "reports" / "llama31-8b-lora-7x4090-ddp.log").read_text())
    assert lines[0].startswith("CUDA OOM in forward: asked 3.91 GiB with 3.52 GiB free of 23.65 GiB")
    assert fixes(lines)[:2] == [fix_text("fused_loss"), fix_text("checkpointing")]


def test_eager_attention_scores_put_flash_attention_first(tmp_path, capsys):
    text = traceback(*TRAIN,
                     ("transformers/models/qwen2/modeling_qwen2.py", 221, "eager_attention_forward",
                      "attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32)"),
                     ("torch/nn/functional.py", 2140, "softmax", "ret = input.softmax(dim, dtype=dtype)"),
                     message=oom("8.00 GiB", "79.15 GiB", "6.57 GiB", "72.57 GiB", "71.02 GiB", "1.06 GiB"))
    _, lines = doctor(tmp_path, capsys, text)
    assert lines[0].startswith("CUDA OOM in forward: asked 8.00 GiB")
    assert fixes(lines)[0] == fix_text("flash_attention")


def test_an_optimizer_step_oom_gets_the_optimizer_fixes(tmp_path, capsys):
    _, lines = doctor(tmp_path, capsys, traceback(*ADAM_STEP, message=ADAM_OOM))
    assert lines[0] == "CUDA OOM at the optimizer step: asked 2.00 GiB with 1.18 GiB free of 23.64 GiB"
    assert fixes(lines)[:3] == [fix_text(n) for n in ("shard_optimizer", "optimizer_8bit", "offload_optimizer")]


def test_a_deepspeed_load_oom_gets_the_sharding_fixes(tmp_path, capsys):
    _, lines = doctor(tmp_path, capsys, traceback(*ZERO2_INIT, message=ZERO2_OOM))
    assert lines[0] == "CUDA OOM at load: asked 14.96 GiB with 12.31 GiB free of 79.15 GiB"
    assert fixes(lines)[:2] == [fix_text("shard_weights"), fix_text("offload_optimizer")]


def test_a_host_kill_at_load_says_host_ram_and_gets_the_loading_fixes(tmp_path, capsys):
    _, lines = doctor(tmp_path, capsys, (HERE / "corpus" / "openrlhf-841.log").read_text())
    assert lines[0].startswith("host RAM ran out at load")
    assert fixes(lines)[0] == fix_text("low_cpu_mem_usage") and len(fixes(lines)) >= 2


def test_json_carries_the_answer_and_the_rule_fixes(tmp_path, capsys):
    _, lines = doctor(tmp_path, capsys, BACKWARD, "--json")
    doc = json.loads("\n".join(lines))
    assert set(doc) == {"schema", "failures", "findings", "fixes"}
    [f] = parse_log(BACKWARD).failures
    assert doc["findings"][0]["text"] == headline(f) and doc["findings"][0]["phase"] == "backward"
    assert [fx["rank"] for fx in doc["fixes"]] == list(range(1, len(doc["fixes"]) + 1))
    first = doc["fixes"][0]
    assert (first["from"], first["changes"], first["knobs"]) == ("rule", [], {"checkpointing": "full"})


LOGS = sorted((HERE / "corpus").glob("*.log")) + sorted((HERE / "reports").glob("*.log"))


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_every_line_fits_80_columns_and_ends_with_what_to_do_next(log, capsys):
    if not parse_log(log.read_text()).failures and not parse_log(log.read_text()).timeline:
        pytest.skip("no failure: the one-line error (test_forms.py)")
    assert main(["doctor", str(log)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80, [x for x in lines if len(x) > 80]
    assert lines[0] and not lines[0].startswith(" ")
    assert pasted(lines)[:2] == ["memfit", "doctor"]


# ---------------------------------------------------------------- with a config: the log's capacity

REPORT = HERE / "reports" / "llama31-8b-lora-7x4090-ddp.log"
CONFIG = ROOT / "tests" / "formats" / "examples" / "llamafactory" / "examples" / "train_lora" / \
    "llama31_8b_lora_7x4090.yaml"


def test_the_logs_total_capacity_is_the_cards_and_doctor_says_so(capsys):
    assert main(["doctor", str(REPORT), "--from", str(CONFIG), "--gpu", "rtx4090", "--gpus", "7"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80
    assert main(["doctor", str(REPORT), "--from", str(CONFIG), "--gpu", "rtx4090", "--gpus", "7", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    total = doc["failures"][0]["total_bytes"]
    note = next(x for x in doc["findings"] if x["kind"] == "capacity")
    assert note["log_bytes"] == total and note["catalog_bytes"] != total
    text = " ".join(lines)
    verdict = next(x["text"] for x in doc["findings"] if x["kind"] == "verdict")
    card = f"{total / GiB:,.2f} GiB"
    assert verdict.endswith(f"of {card})") and f"{note['catalog_bytes'] / GiB:,.2f} GiB" not in verdict
    assert "taken from the log" in text and "gpu_mismatch" not in {x["kind"] for x in doc["findings"]}
    assert any(fx["from"] == "planner" for fx in doc["fixes"])
    # the plan command pastes whole although the config's path is longer than a line
    assert pasted(lines)[:4] == ["memfit", "plan", "--from", str(CONFIG)] and len(str(CONFIG)) > 80


def test_a_typed_gpu_mem_is_kept_and_another_card_is_a_mismatch(capsys):
    args = ["doctor", str(REPORT), "--from", str(CONFIG), "--gpus", "7", "--json"]
    assert main([*args, "--gpu", "rtx4090", "--gpu-mem", "24GiB"]) == 0
    kinds = {x["kind"] for x in json.loads(capsys.readouterr().out)["findings"]}
    assert "capacity" not in kinds
    assert main([*args, "--gpu", "a100-80gb"]) == 0
    kinds = {x["kind"] for x in json.loads(capsys.readouterr().out)["findings"]}
    assert "capacity" not in kinds and "gpu_mismatch" in kinds
