"""Each subcommand's short usage line and its examples, shown by `memfit COMMAND --help`.

argparse's own usage line lists every option (84 for estimate, 124 columns at the widest); a user reads the
command's shape from a short line and its examples instead, and the option list below it stays grouped.
tests/cli/test_help.py parses every example with build_parser(), so an example cannot name a flag that is gone.
"""
from __future__ import annotations

import argparse

# command -> (usage after "usage: memfit COMMAND", or None for argparse's own when it is short; examples)
HELP: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "estimate": ("MODEL --gpu GPU [--gpus N] [knobs...] [--json] [--html F]", (
        "memfit estimate llama3.1-8b --gpu rtx4090 --tuning lora --seq 2048",
        "memfit estimate qwen2.5-7b --gpu a100-80gb --gpus 4 --zero 3 --ckpt --json",
        "memfit estimate --from train_lora.yaml --gpu h100 --html report.html",
    )),
    "trace": ("MODEL --gpu GPU [knobs...] [--steps N] [--compare] [--json]", (
        "memfit trace qwen2.5-0.5b --gpu rtx4090 --tuning lora --compare",
        "memfit trace qwen2.5-0.5b --gpu h100 --timeline steps.json --html trace.html",
    )),
    "measure": ("MODEL --gpu GPU [knobs...] [--steps N] [--weights DIR]", (
        "memfit measure qwen2.5-0.5b --gpu rtx4090 --tuning lora --steps 3",
        "memfit measure qwen2.5-0.5b --gpu-mem 24GiB --weights ./Qwen2.5-0.5B --json",
    )),
    "plan": ("MODEL --gpu GPU [--gpus N] [knobs...] [--allow ...] [--json]", (
        "memfit plan llama3.1-8b --gpu rtx4090 --gpus 2 --tuning full --allow lora",
        "memfit plan llama3.1-8b --gpu rtx4090 --tuning lora --max-seq",
        "memfit plan --from train.yaml --gpu a100-80gb --gpus 8 --top 10 --json",
        "memfit plan llama-2-7b --gpu a100-80gb --gpus 8 --method ppo --brief",
    )),
    "fit": ("FILE --gpu GPU [--gpus N] [--allow ...] [--out DIR|--in-place]", (
        "memfit fit llama3_lora_sft.yaml --gpu rtx4090 --gpus 2",
        "memfit fit ds_config.json --model qwen2.5-7b --gpu h100 --gpus 8 --in-place",
        "memfit fit train.yaml --gpu a100-40gb --gpus 4 --row 2 --out fixed",
        "memfit fit train.yaml --gpu t4 --attn sdpa --precision fp16-mixed",
    )),
    "doctor": ("LOG [--from FILE] [--gpu GPU] [knobs...] [--json]", (
        "memfit doctor train.log",
        "memfit doctor train.log --from train.yaml --gpu rtx4090",
        "memfit doctor - --json",
    )),
    "watch": ("RUN.jsonl... [--follow] [--gpu GPU] [--json] [--html FILE]", (
        "memfit watch run.jsonl --gpu a100-80gb",
        "memfit watch run.jsonl --follow --until-steps 100",
        "memfit watch run.jsonl --estimate-from train.yaml --gpu h100 --html run.html",
    )),
    "calibrate": ("RUN.jsonl [--from FILE] [knobs...] [--save [FILE]]", (
        "memfit calibrate run.jsonl --from train.yaml",
        "memfit calibrate run.jsonl --from train.yaml --save",
    )),
    "serve": (None, (
        "memfit serve",
        "memfit serve --port 8080",
    )),
    "models": (None, (
        "memfit models",
        "memfit models qwen",
    )),
    "gpus": (None, (
        "memfit gpus",
        "memfit gpus 4090",
    )),
}


def add_examples(subparsers: argparse._SubParsersAction) -> None:
    """Every subcommand's short usage and an "examples:" epilog (kept as written: one command a line)."""
    for name, parser in subparsers.choices.items():
        usage, examples = HELP[name]
        if usage:
            parser.usage = f"%(prog)s {usage}"
        parser.epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples)
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
