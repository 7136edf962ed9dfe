"""What the fuzz tests and bench/fuzz.py share: the input strategies, one runner per target, the verdict.

A target takes one drawn input and says what memfit did with it. The only outcomes allowed are a result
(exit 0) or one line `memfit: error: ...` with exit 2 (for the readers: a MemfitError whose message is one
line); a traceback, another exit code, stdout written before an error under --json, or more than
TIME_LIMIT seconds is a failure. Inputs start from the valid files in tests/formats/examples (and a few
valid config.json documents) and are mutated: wrong types for a key, unicode, huge or non-finite numbers,
deep nesting, YAML alias bombs, binary bytes, duplicate keys, truncation, empty files, BOMs, random text.
"""
from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import io
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

from memfit.errors import MemfitError  # noqa: E402
from memfit.facts import hub  # noqa: E402
from memfit.facts.knobs import hardware, knobs  # noqa: E402

PLAN_BUDGET = 60  # estimates: the planner's search stops here (planner/space.py BUDGET), far under TIME_LIMIT
TIME_LIMIT = 2.0  # CPU seconds per input (CPU, not wall: the machine is shared and its load varies)
HANG_LIMIT = 20.0  # wall seconds after which the alarm stops an input as hung
MAX_ERROR = 2000  # characters: an error line longer than this is a dump, not a message
HERE = Path(__file__).parent
EXAMPLES = HERE.parent / "formats" / "examples"
sys.path.insert(0, str(EXAMPLES.parent))
from format_cases import CASES  # noqa: E402

# --- seeds -----------------------------------------------------------------------------------------------

LAUNCH_EXAMPLES = HERE.parent / "formats" / "launch_examples"  # launch scripts: named from examples/ as ../launch_examples/
AXOLOTL_EXAMPLES = HERE.parent / "formats" / "axolotl_examples"  # read-only format: not among the rewritable cases
SEED_FILES = sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*") if p.is_file()) + sorted(
    f"../launch_examples/{p.relative_to(LAUNCH_EXAMPLES)}" for p in LAUNCH_EXAMPLES.rglob("*") if p.is_file()) + sorted(
    f"../axolotl_examples/{p.relative_to(AXOLOTL_EXAMPLES)}" for p in AXOLOTL_EXAMPLES.rglob("*") if p.is_file())
GPUS_FOR = {name: opts.get("gpus") for name, (opts, _) in CASES.items()}

_LLAMA = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
          "num_key_value_heads": 8, "intermediate_size": 1024, "vocab_size": 1000, "tie_word_embeddings": False,
          "max_position_embeddings": 4096, "hidden_act": "silu", "rms_norm_eps": 1e-5}
MODEL_CONFIGS = [
    _LLAMA,
    {**_LLAMA, "model_type": "qwen2", "num_key_value_heads": 2, "attention_bias": True},
    {**_LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    {**_LLAMA, "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
     "shared_expert_intermediate_size": 512},
    {"model_type": "gemma3", "text_config": {**_LLAMA, "model_type": "gemma3_text", "head_dim": 64,
                                             "hidden_activation": "gelu_pytorch_tanh"}},
    {"model_type": "gpt2", "n_embd": 256, "n_layer": 2, "n_head": 4, "n_inner": None, "vocab_size": 1000,
     "n_positions": 1024, "activation_function": "gelu_new"},
    {"model_type": "falcon", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
     "vocab_size": 1000, "multi_query": True, "new_decoder_architecture": False},
    {**_LLAMA, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}},
    {**_LLAMA, "model_type": "brand_new_lm"},
]

# --- evil values -------------------------------------------------------------------------------------------

DIGITS = "__5000_DIGITS__"  # a number too long for int(str): json.dumps cannot write it, so the text gets it
HUGE = [10**400, -10**400, DIGITS, 1e308, -1e308, float("inf"), float("-inf"), float("nan"), 2**63, -2**63 - 1,
        -1, 0, 0.5, -0.0, 1e-320]
ODD = [None, True, False, "", " ", "auto", "none", "null", "true", "1e400", "nan", "inf", "-1", "0x10", "٣",
       "８", "Ünïcødé 🚀", "\u202e", "a\x00b", "\ud800", "q_proj\nv_proj", [], {}, [1, "a", None], {"a": {"b": [1]}},
       "all", "cpu", "nvme", "fp16", "bf16", "flash_attention_2", "x" * 5000, "../../../../etc/passwd", "/", "~"]
_deep_list = []
_node = _deep_list
for _ in range(150):  # deeper than most code expects, shallower than json's own recursion limit
    _node.append([])
    _node = _node[0]
DEEP = [_deep_list, {"a": {"b": {"c": {"d": {"e": {"f": [[[[{"g": 1}]]]]}}}}}}]

scalars = st.one_of(st.sampled_from(HUGE + ODD), st.integers(), st.floats(), st.text(max_size=20), st.booleans())
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                           max_leaves=8)
# a copy each draw: a later mutation may reach inside a drawn list or mapping, and the pool must stay as written
evil_values = st.one_of(st.sampled_from(HUGE + ODD + DEEP), json_values).map(copy.deepcopy)

# YAML text that a value can be replaced with (as written, not as dumped)
YAML_TOKENS = ["", "~", "[", "{", "]", "}", ":", "- a", "!!python/object:os.system", "!!binary aGVsbG8=", "&a [*a]",
               "*nope", "1e400", ".nan", "-.inf", "0o777", "0b101", "2001-12-14", "12:30:00", "yes", "no", "on",
               "'unterminated", '"\\uZZZZ"', "|\n  block", ">-", "@", "`", "%TAG", "{a: 1, a: 2}", "[1, [2, [3]]]",
               "9" * 500, "-" * 3, "\t", "é", "\x00", "\x85", "\ufeff"]
CMD_TOKENS = ["", "''", '"', "'", "\\", "$HOME", "${X:-1}", "`id`", "$(id)", "--", "-", "---x", "1e400", "nan", "-1",
              "0", "9" * 500, "a b", "é", "\x00", "|", ";", "&&", "<<EOF", "EOF", "#", "--zero_stage", "--ds.zero_stage",
              "--lora_rank", "--micro_train_batch_size", "--max_len", "--flash_attn", "--adam_offload"]

def bomb_with(key: str) -> str:
    """A billion-laughs YAML value for a key the reader uses: six anchors of ten aliases each (10^6 leaves
    expanded; bigger would only prove the point by exhausting memory). A reader that repr()s or walks it
    expanded shows up as a megabyte-long error line or as a slow input."""
    levels = ["&l0 [" + ", ".join(["x"] * 10) + "]"]
    levels += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 6)]
    return f"{key}: [{', '.join(levels)}]\n"


# --- mutations of a file's text ------------------------------------------------------------------------------

@st.composite
def _json_mutation(draw, text: str) -> str:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):  # an earlier mutation broke it
        return text
    for _ in range(draw(st.integers(1, 3))):
        doc = draw(_mutate_tree(doc))
    text = json.dumps(doc, indent=draw(st.sampled_from([None, 2])), ensure_ascii=draw(st.booleans()))
    return text.replace(f'"{DIGITS}"', "9" * 5000)


@st.composite
def _yaml_mutation(draw, text: str) -> str:
    import yaml

    try:
        doc = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError):  # an earlier mutation broke it
        return text
    for _ in range(draw(st.integers(1, 3))):
        doc = draw(_mutate_tree(doc))
    try:
        text = yaml.safe_dump(doc, allow_unicode=draw(st.booleans()), sort_keys=False)
        return text.replace(DIGITS, "9" * 5000)
    except (yaml.YAMLError, ValueError, OverflowError, RecursionError):
        return text


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


@st.composite
def _mutate_tree(draw, doc):
    """One change of a parsed document: a value replaced by an evil one, a key deleted, renamed or added."""
    paths = [p for p in _paths(doc) if p]
    if not paths:
        return draw(evil_values)
    path = draw(st.sampled_from(paths))
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    key = path[-1]
    op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "rename", "add", "wrap"]))
    if op == "replace":
        parent[key] = draw(evil_values)
    elif op == "wrap":
        parent[key] = draw(st.sampled_from([[parent[key]], {"value": parent[key]}, str(parent[key])]))
    elif op == "delete":
        del parent[key]
    elif isinstance(parent, dict):
        new_key = draw(st.sampled_from([key.upper(), key + "_", key.replace("_", "-"), "é" + key, "", " ",
                                        "train_batch_size", "zero_optimization", "stage", "deepspeed", "fsdp",
                                        "distributed_type", "quantization_config", "text_config", "model_type"]))
        value = parent.pop(key) if op == "rename" else draw(evil_values)
        parent[new_key] = value
    return doc


@st.composite
def _yaml_line_mutation(draw, text: str) -> str:
    """A `key: value` line's value replaced by raw YAML (anchors, tags, broken flows, huge numbers)."""
    lines = text.split("\n")
    keyed = [i for i, line in enumerate(lines) if re.match(r"\s*[\w.-]+:\s", line + " ")]
    if not keyed:
        return text
    i = draw(st.sampled_from(keyed))
    key = lines[i].split(":", 1)[0]
    lines[i] = f"{key}: {draw(st.one_of(st.sampled_from(YAML_TOKENS), st.text(max_size=12)))}"
    return "\n".join(lines)


@st.composite
def _command_mutation(draw, text: str) -> str:
    """An OpenRLHF command with a flag's value replaced, a flag added or removed, or a token corrupted."""
    flags = list(re.finditer(r"--[\w.-]+", text))
    if not flags:
        return text
    m = draw(st.sampled_from(flags))
    token = draw(st.one_of(st.sampled_from(CMD_TOKENS), st.text(max_size=12)))
    op = draw(st.sampled_from(["value", "insert", "delete", "duplicate"]))
    rest = text[m.end():]
    value = re.match(r"[ \t]+([^\s\\-][^\s\\]*)?", rest)
    if op == "value" and value and value.group(1):
        return text[:m.end()] + " " + token + rest[value.end():]
    if op == "insert":
        flag = draw(st.sampled_from([f.group() for f in flags]))
        return text[:m.end()] + f" {token} {flag} {draw(st.sampled_from(CMD_TOKENS))}" + rest
    if op == "delete":
        return text[:m.start()] + rest
    return text[:m.end()] + rest[:value.end() if value else 0] + " " + m.group() + " " + token + rest


@st.composite
def _text_mutation(draw, text: str) -> str:
    lines = text.split("\n")
    op = draw(st.sampled_from(["truncate", "duplicate_line", "delete_line", "insert", "crlf", "tabs", "bomb",
                               "empty", "whitespace", "deep", "random"]))
    if op == "truncate":
        return text[:draw(st.integers(0, len(text)))]
    if op == "duplicate_line":
        i = draw(st.integers(0, len(lines) - 1))
        return "\n".join(lines[:i + 1] + [lines[i]] + lines[i + 1:])
    if op == "delete_line":
        i = draw(st.integers(0, len(lines) - 1))
        return "\n".join(lines[:i] + lines[i + 1:])
    if op == "insert":
        i = draw(st.integers(0, len(text)))
        return text[:i] + draw(st.text(min_size=1, max_size=8)) + text[i:]
    if op == "crlf":
        return text.replace("\n", "\r\n")
    if op == "tabs":
        return text.replace("  ", "\t")
    if op == "bomb":
        key = draw(st.sampled_from([m.group(1) for m in re.finditer(r"^([\w.-]+):", text, re.M)] or ["x"]))
        return bomb_with(key) + "\n".join(line for line in lines if not line.startswith(key + ":"))
    if op == "empty":
        return ""
    if op == "whitespace":
        return draw(st.sampled_from([" ", "\n\n", "\t", "#", "{}", "[]", "null", "---", "...", "0"]))
    if op == "deep":
        n = draw(st.sampled_from([100, 1000, 100_000]))
        return draw(st.sampled_from(["[" * n + "]" * n, '{"a":' * n + "1" + "}" * n, "a:\n" + "- " * n + "x",
                                     "[" * n, "a: " + "[" * n + "]" * n]))
    return draw(st.text(max_size=200))


def _to_bytes(draw, text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    op = draw(st.sampled_from(["utf8", "utf8", "utf8", "bom", "utf16", "latin1", "bytes", "nul"]))
    if op == "bom":
        return b"\xef\xbb\xbf" + data
    if op == "utf16":
        return text.encode("utf-16", "surrogatepass")
    if op == "latin1":
        return text.encode("latin-1", "replace")
    if op == "bytes":
        i = draw(st.integers(0, len(data)))
        return data[:i] + draw(st.binary(min_size=1, max_size=16)) + data[i:]
    if op == "nul":
        return data.replace(b"\n", b"\x00\n", 1)
    return data


@st.composite
def mutated_file(draw, seeds=tuple(SEED_FILES)) -> tuple[str, bytes]:
    """(file name under examples/, its bytes): a seed file mutated one to three times, or random bytes."""
    name = draw(st.sampled_from(seeds))
    text = (EXAMPLES / name).read_text()
    if draw(st.integers(0, 19)) == 0:  # fully random content under a known name
        return name, draw(st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
    suffix = Path(name).suffix
    structured = {".json": _json_mutation, ".yaml": _yaml_mutation}.get(suffix, _command_mutation)
    for _ in range(draw(st.integers(1, 2))):
        choices = [structured, _text_mutation] + ([_yaml_line_mutation] if suffix == ".yaml" else [])
        text = draw(draw(st.sampled_from(choices))(text))
    return name, _to_bytes(draw, text)


@st.composite
def config_file_case(draw) -> dict:
    """An input of read_config: the file, its (sometimes changed) suffix, the GPU count."""
    name, data = draw(mutated_file())
    if draw(st.integers(0, 9)) == 0:
        name = str(Path(name).with_suffix(draw(st.sampled_from(["", ".json", ".yaml", ".yml", ".sh", ".txt", ".cfg"]))))
    gpus = draw(st.sampled_from([GPUS_FOR.get(name), None, 1, 2, 8, 3, 1024]))
    return {"name": name, "data": data, "gpus": gpus}


@st.composite
def model_config_case(draw) -> dict:
    """A config.json (a valid one mutated) estimated through the CLI, as a file or as its folder."""
    doc = json.loads(json.dumps(draw(st.sampled_from(MODEL_CONFIGS))))
    if draw(st.integers(0, 9)) == 0:
        data = draw(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
    else:
        for _ in range(draw(st.integers(1, 3))):
            doc = draw(_mutate_tree(doc))
        text = json.dumps(doc, indent=2, ensure_ascii=draw(st.booleans())).replace(f'"{DIGITS}"', "9" * 5000)
        if draw(st.integers(0, 3)) == 0:
            text = draw(_text_mutation(text))
        data = _to_bytes(draw, text)
    knobs_ = draw(st.sampled_from([[], ["--tuning", "lora"], ["--tuning", "qlora"], ["--zero", "3", "--gpus", "4"],
                                   ["--method", "dpo"], ["--attn", "eager", "--seq", "8192"]]))
    return {"data": data, "as_folder": draw(st.booleans()), "knobs": knobs_}


# --- argv -------------------------------------------------------------------------------------------------

MODELS = ["qwen2-7b", "Qwen/Qwen2-7B-Instruct", "llama-3.1-8b", "mixtral-8x7b", "gemma-2-9b", "qwen2.5-0.5b"]
GPUS = ["rtx4090", "a100-80gb", "h100", "t4", "v100-16gb"]
ARG_TOKENS = ["", "-", "--", "-h", "--json", "0", "-1", "1e400", "9" * 400, "nan", "inf", "-inf", "1.5", "1e3", "٣",
              "８", "é", "🚀", "a/b", "org/name@rev", "./x.json", "/", "~", "x" * 300, "x/" * 200, "24GiB", "0GiB",
              "1e308GB", "9" * 400 + "GiB", "-5GB", "1.4TB", "ab=cd", "actor=1e400", "actor=4,critic", "=",
              "q_proj,,v_proj", ",", "true", "--gpus", "--gpu", "--seq", "--zero", "--from", "--max-seq", "--top"]


def _flag_specs():
    out = []
    for k in (*hardware().values(), *knobs().values()):
        valid = [str(c) for c in k.choices] or {"int": ["1", "2", "8", "4096"], "float": ["0.5", "0.9"],
                                                "bool": [], "size": ["24GiB", "1.4TB"]}.get(k.type, ["x"])
        for flag in (k.flag, *k.aliases):
            out.append((flag, valid, k.type == "bool"))
            if k.type == "bool":
                out.append(("--no-" + flag[2:], [], True))
    return out


FLAGS = _flag_specs()


@st.composite
def _knob_args(draw, n_max=4) -> list[str]:
    out = []
    for _ in range(draw(st.integers(0, n_max))):
        flag, valid, is_bool = draw(st.sampled_from(FLAGS))
        out.append(flag)
        if not is_bool or draw(st.integers(0, 4)) == 0:
            pools = [st.sampled_from(ARG_TOKENS), st.text(min_size=1, max_size=10)] + ([st.sampled_from(valid)] * 3
                                                                                     if valid else [])
            out.append(draw(st.one_of(*pools)))
    return out


def _arg_text():
    return st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12)


@st.composite
def _mutate_argv(draw, argv: list[str]) -> list[str]:
    """Drop, replace or insert tokens (never a NUL: a real argv cannot hold one)."""
    argv = list(argv)
    for _ in range(draw(st.integers(0, 2))):
        op = draw(st.sampled_from(["drop", "replace", "insert"]))
        i = draw(st.integers(1, max(1, len(argv) - 1)))
        token = draw(st.one_of(st.sampled_from(ARG_TOKENS), _arg_text()))
        if op == "drop" and len(argv) > 1:
            del argv[i]
        elif op == "replace" and i < len(argv):
            argv[i] = token
        else:
            argv.insert(i, token)
    return argv


@st.composite
def cli_case(draw, command: str) -> dict:
    """argv for `estimate`, `plan`, `plan --max-seq/--max-batch` or `fit`; FILE / OUT are filled in by the runner."""
    files = {}
    if command == "fit":
        name = draw(st.sampled_from([n for n in SEED_FILES if n in CASES]))
        if draw(st.booleans()):
            name, data = draw(mutated_file((name,)))
        else:
            data = (EXAMPLES / name).read_bytes()
        files[name] = data
        argv = ["fit", "{FILE:" + name + "}", "--gpu", draw(st.sampled_from(GPUS)), "--gpus",
                draw(st.sampled_from(["1", "2", "4", "8"])), "--out", "{OUT}"]
        argv += draw(st.sampled_from([[], ["--allow", "lora"], ["--no-resume"], ["--global-batch", "64"],
                                      ["--model", "qwen2-7b"], ["--host-ram", "64GB"], ["--no-code-edits"]]))
    else:
        argv = [command.split("_")[0], draw(st.sampled_from(MODELS))]
        if command != "plan_limits" or draw(st.booleans()):
            argv += ["--gpu", draw(st.sampled_from(GPUS))]
        if command == "plan_limits":
            argv.append(draw(st.sampled_from(["--max-seq", "--max-batch"])))
        argv += draw(_knob_args())
        if command == "estimate" and draw(st.integers(0, 3)) == 0:
            name = draw(st.sampled_from([n for n in SEED_FILES if n in CASES]))
            files[name] = (EXAMPLES / name).read_bytes()
            argv += ["--from", "{FILE:" + name + "}"]
        if command != "estimate" and draw(st.booleans()):
            argv += draw(st.sampled_from([["--top", "2"], ["--allow", "lora,qlora"], ["--global-batch", "32"],
                                          ["--no-resume"], ["--no-code-edits"]]))
        if draw(st.integers(0, 3)):
            argv.append("--json")
    return {"argv": draw(_mutate_argv(argv)), "files": files}


# --- running one input ----------------------------------------------------------------------------------------

@dataclass
class Outcome:
    kind: str  # result | error | failure
    detail: str = ""
    seconds: float = 0.0
    input: dict = field(default_factory=dict)


class Hang(BaseException):
    """Raised by the alarm: BaseException so that no `except Exception` in memfit swallows it."""


@contextlib.contextmanager
def time_limit(seconds: float = HANG_LIMIT):
    def alarm(signum, frame):
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _no_hub(repo_id, revision):  # the fuzz never reaches the network: a hub id is refused as if offline
    raise hub.HubError(f"{repo_id} is not in the HF cache (fuzz run: offline)")


@contextlib.contextmanager
def _scratch():
    """A scratch folder, no hub, and a small plan budget, all undone after (other tests keep theirs)."""
    from memfit.planner import space

    old, budget = hub.config_path, space.BUDGET
    hub.config_path = _no_hub
    space.BUDGET = PLAN_BUDGET
    folder = Path(tempfile.mkdtemp(prefix="memfit-fuzz-"))
    try:
        yield folder
    finally:
        hub.config_path = old
        space.BUDGET = budget
        shutil.rmtree(folder, ignore_errors=True)


@functools.cache
def _examples_copy() -> Path:
    """One copy of the examples per process; an input is written beside its seed (so the DeepSpeed JSON a
    file names is found) under its own name, and removed after."""
    folder = Path(tempfile.mkdtemp(prefix="memfit-fuzz-examples-"))
    atexit.register(shutil.rmtree, folder, True)
    shutil.copytree(EXAMPLES, folder / "examples")
    shutil.copytree(LAUNCH_EXAMPLES, folder / "launch_examples")  # beside examples/, which its scripts name
    shutil.copytree(AXOLOTL_EXAMPLES, folder / "axolotl_examples")
    return folder / "examples"


def _beside_seed(name: str, data: bytes) -> Path:
    seed = _examples_copy() / name
    path = seed.with_name(f"fuzz-{os.getpid()}-{seed.name}")
    path.write_bytes(data)
    return path


def _timed(fn) -> tuple[str, str, float]:
    """Run fn under the time limit: ('ok', value) / ('memfit', message) / ('crash', traceback), CPU seconds.
    An input over the limit is timed once more and is slow only when both runs are: a slow input is slow every
    time, while a busy machine (cache misses, a collector pass) can push one run of a quick input over."""
    kind, detail, seconds = _run_once(fn)
    if seconds > TIME_LIMIT and kind != "crash":
        kind, detail, seconds = _run_once(fn)
        if seconds > TIME_LIMIT and kind != "crash":
            kind, detail = "crash", f"slow: {seconds:.2f} CPU s"
    return kind, detail, seconds


def _run_once(fn) -> tuple[str, str, float]:
    start = time.process_time()
    try:
        with time_limit():
            value = fn()
        kind, detail = "ok", value
    except MemfitError as e:
        kind, detail = "memfit", str(e)
    except Hang as e:
        kind, detail = "crash", f"hang: {e}"
    except BaseException:  # noqa: BLE001 - a traceback is the finding
        kind, detail = "crash", traceback.format_exc(limit=-6)
    return kind, detail, time.process_time() - start


def _reader_outcome(kind, detail, seconds, case) -> Outcome:
    if kind == "ok":
        return Outcome("result", "", seconds, case)
    if kind == "memfit" and "\n" not in detail.strip() and 0 < len(detail.strip()) <= MAX_ERROR:
        return Outcome("error", detail, seconds, case)
    return Outcome("failure", detail if kind == "crash" else f"not one short line: {detail[:300]!r}", seconds, case)


def run_read_config(case: dict) -> Outcome:
    from memfit.interfaces.formats import read_config

    path = _beside_seed(case["name"], case["data"])
    try:
        with _scratch():
            kind, detail, seconds = _timed(lambda: read_config(path, gpus=case["gpus"]))
    finally:
        path.unlink()
    return _reader_outcome(kind, detail, seconds, {**case, "file": str(path)})


def run_cli(case: dict) -> Outcome:
    """main(argv) in-process: exit 0, or exit 2 with one `memfit: error:` line and (under --json) no stdout."""
    from memfit.interfaces.cli.main import main

    with _scratch() as folder:
        argv = []
        for token in case["argv"]:
            for name, data in case.get("files", {}).items():
                if token == "{FILE:" + name + "}":
                    token = str(_beside_seed(name, data))
            argv.append(str(folder / "out") if token == "{OUT}" else token)
        if "config_json" in case:
            target = folder / "model" / "config.json"
            target.parent.mkdir()
            target.write_bytes(case["config_json"])
            argv[1] = str(target.parent if case.get("as_folder") else target)
        out, err = io.StringIO(), io.StringIO()

        def call():  # may run twice (_timed): each run starts with empty output
            for stream in (out, err):
                stream.seek(0)
                stream.truncate()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.chdir(folder):
                try:
                    return main(argv)
                except SystemExit as e:  # --help prints and exits 0
                    return e.code

        kind, code, seconds = _timed(call)
        for name in case.get("files", {}):
            _beside_seed(name, b"").unlink()
    stdout, stderr = out.getvalue(), err.getvalue()
    shown = {**case, "argv": argv}
    if kind == "crash":
        return Outcome("failure", code, seconds, shown)
    if kind == "memfit":  # raised past main: main must catch it
        return Outcome("failure", f"MemfitError escaped main: {code}", seconds, shown)
    if code in (0, None):
        if "--json" in argv and "-h" not in argv and "--help" not in argv:
            try:
                json.loads(stdout)
            except ValueError:
                return Outcome("failure", f"exit 0 but --json stdout is not JSON: {stdout[:200]!r}", seconds, shown)
        return Outcome("result", "", seconds, shown)
    lines = stderr.strip().splitlines()
    if code != 2:
        return Outcome("failure", f"exit {code}: {stderr[-300:]!r}", seconds, shown)
    if len(lines) != 1 or not lines[0].startswith("memfit: error:") or len(lines[0]) > MAX_ERROR:
        return Outcome("failure", f"exit 2 but stderr is not one `memfit: error:` line: {stderr[-300:]!r}", seconds, shown)
    if "--json" in argv and stdout:
        return Outcome("failure", f"exit 2 with stdout under --json: {stdout[:200]!r}", seconds, shown)
    return Outcome("error", lines[0], seconds, shown)


def run_model_config(case: dict) -> Outcome:
    argv = ["estimate", "MODEL", "--gpu", "h100", *case["knobs"], "--json"]
    return run_cli({"argv": argv, "config_json": case["data"], "as_folder": case["as_folder"]})


# name -> (strategy, runner, default examples in the pytest suite)
TARGETS = {
    "read_config": (config_file_case(), run_read_config, 500),
    "model_config": (model_config_case(), run_model_config, 150),
    "estimate": (cli_case("estimate"), run_cli, 200),
    "plan": (cli_case("plan"), run_cli, 50),
    "plan_limits": (cli_case("plan_limits"), run_cli, 50),
    "fit": (cli_case("fit"), run_cli, 40),
}


def warm_up() -> None:
    """Import and cache what every target uses, so the first drawn input is not timed with the imports."""
    run_cli({"argv": ["estimate", "qwen2-7b", "--gpu", "rtx4090", "--json"]})
    run_cli({"argv": ["plan", "qwen2-7b", "--gpu", "rtx4090", "--json"]})
    run_read_config({"name": SEED_FILES[0], "data": (EXAMPLES / SEED_FILES[0]).read_bytes(), "gpus": None})
