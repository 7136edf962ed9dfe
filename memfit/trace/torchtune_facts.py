"""The measured rows of data/frameworks/torchtune.toml [model_code], re-derived from torchtune's own code.

    .venvs/torchtune/bin/python -m memfit.trace.torchtune_facts           # print the derived rows
    .venvs/torchtune/bin/python -m memfit.trace.torchtune_facts --check   # exit 1 when the shipped rows differ

`chunked_loss` / `standard_loss`: a LoRA step (the output head frozen, so it saves no input) of a one-layer
Llama-3.2-1B under CEWithChunkedOutputLoss / CrossEntropyLoss; the logits/loss bytes at the forward peak, at the
end of forward and at the backward peak, per logit element.
`chunked_loss_head`: full steps of a one-layer Llama-3.1-8B (an untied, trained head) at two sequence lengths;
the backward peak of the logits/loss region is per token (its bf16 logit gradients still waiting, per vocabulary
entry, and the head's saved input) plus head-weight-sized gradients: the slope and the intercept.
The other rows are read from torchtune's code; tests/trace/test_torchtune.py checks them through the estimate
against whole traces.
"""
from __future__ import annotations

import argparse
import sys

from memfit.facts.frameworks import framework
from memfit.facts.scenario import Scenario

MODEL, HEAD_MODEL = "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B"
ROWS, SEQ = 2, 512  # 1,024 tokens: a multiple of the 8 chunks, as the recipes' padded batches are not always
DIGITS = 3
LOSSES = {"chunked_loss": "chunked_output", "standard_loss": "standard"}


def _scenario(model: str, knobs: dict) -> Scenario:
    from memfit.trace.torchtune import scenario_of

    return scenario_of(model, {"micro_batch": ROWS, "seq_len": SEQ, "checkpointing": "off"} | knobs, 1)


def _loss_tail(loss: str) -> list[float]:
    from memfit.trace.torchtune import run_torchtune_trace

    s = _scenario(MODEL, {"tuning": "lora", "lora_rank": 8, "lora_targets": ("q_proj", "v_proj"), "loss": loss})
    r = run_torchtune_trace(s)
    elements = s.tokens_per_micro_batch * s.model.vocab_size
    return [round(b.get("logits_loss") / elements, DIGITS)
            for b in (r.profile.phases["forward"], r.marks["forward_end"], r.profile.phases["backward"])]


def _chunked_head() -> list:
    from memfit.trace.torchtune import run_torchtune_trace

    points = []
    for seq in (SEQ, 2 * SEQ):
        s = _scenario(HEAD_MODEL, {"tuning": "full", "seq_len": seq})
        points.append((s.tokens_per_micro_batch, run_torchtune_trace(s).profile.phases["backward"].get("logits_loss")))
    (n1, b1), (n2, b2) = points
    slope = (b2 - b1) / (n2 - n1)
    m = s.model
    head = m.vocab_size * m.hidden_size * 2
    return [round((slope - 2 * m.hidden_size) / m.vocab_size, DIGITS), round((b1 - slope * n1) / head)]


def derive() -> dict:
    from memfit.trace.torchtune import torchtune_version

    out: dict[str, str | list[float]] = {"torchtune": torchtune_version()}
    out |= {key: _loss_tail(loss) for key, loss in LOSSES.items()}
    return out | {"chunked_loss_head": _chunked_head()}


def shipped() -> dict:
    code = framework("torchtune").model_code
    out = {"torchtune": code["torchtune"]}
    return out | {key: [round(x, DIGITS) for x in code[key]] for key in (*LOSSES, "chunked_loss_head")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped rows instead of printing")
    args = parser.parse_args(argv)
    got = derive()
    if not args.check:
        for key, value in got.items():
            print(f"{key} = {value!r}".replace("'", '"'))
        return 0
    want = shipped()
    if got == want:
        print(f"torchtune.toml [model_code] matches torchtune {got['torchtune']}")
        return 0
    print(f"torchtune.toml [model_code] differs: shipped {want}, derived {got}: re-derive it")
    return 1


if __name__ == "__main__":
    sys.exit(main())
