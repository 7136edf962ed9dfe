#!/usr/bin/env bash
# bench/cuda_truth.py on the GPU machine (the device tool's one H200), in one call, results into $OUT as it goes.
#
# Here, once, in the repository root (needs PyPI; the wheels are never committed: .git/info/exclude holds /.whl/):
#
#     echo /.whl/ >> .git/info/exclude          # if it is not there yet
#     bash bench/cuda_truth_device.sh prepare   # the pip download below, then bitsandbytes slimmed to its CPU +
#                                               # CUDA 13 libraries (43 MB -> ~7 MB: the working tree travels in 64 MiB)
#
#   which runs (the device's python3 is 3.12; bitsandbytes' wheel is manylinux_2_24):
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
#       -d .whl bitsandbytes==0.50.2 liger-kernel==0.8.5 transformers==5.24.0 peft==0.21.2
#   bitsandbytes and liger-kernel are missing there; transformers and peft are memfit's pins (memfit/facts/data/
#   versions.toml), so the run measures the code memfit's facts were derived on (the machine has transformers 5.17).
#   Their other requirements are on the machine (KINDS.md: huggingface-hub 1.33, tokenizers, safetensors, accelerate
#   1.15, triton 3.6, nvidia-ml-py).
#
# Then the device tool's run, as is (7 minutes, leaving room for one rerun in a 15-minute lease):
#
#     run(command="bash bench/cuda_truth_device.sh", carry=[".whl"], timeout_s=420)
#
# Rows start until BUDGET_S (default 300 s) is spent, so the slowest last row still ends inside the timeout. To rerun
# what a cut-short or failed run left out, copy its returned cuda_truth.jsonl to .whl/partial.jsonl (carried, never
# committed) and pass it: run(command="bash bench/cuda_truth_device.sh .whl/partial.jsonl", carry=[".whl"], ...): its
# ok / oom rows are kept and skipped, the others run. Commit the rows as bench/cuda_h200.json, then
# `python bench/cuda_truth.py --compare bench/cuda_h200.json`.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "prepare" ]; then
    set -e
    mkdir -p .whl
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        -d .whl bitsandbytes==0.50.2 liger-kernel==0.8.5 transformers==5.24.0 peft==0.21.2
    # keep bitsandbytes' CPU and CUDA 13.x libraries only (the machine's torch is built for CUDA 13)
    python3 - <<'EOF'
import glob, os, re, zipfile
(path,) = glob.glob(".whl/bitsandbytes-*.whl")
slim = path + ".slim"
with zipfile.ZipFile(path) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
    for item in src.infolist():
        lib = re.search(r"libbitsandbytes_(\w+)\.so$", item.filename)
        if lib is None or lib.group(1) in ("cpu", "cuda130", "cuda132"):
            dst.writestr(item, src.read(item.filename))
os.replace(slim, path)
EOF
    du -ch .whl/*.whl | tail -1
    echo "next: run(command=\"bash bench/cuda_truth_device.sh\", carry=[\".whl\"], timeout_s=420)"
    exit 0
fi

OUT="${OUT:-bench/cuda_truth_out}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} \
        || echo "the carried wheels did not install: running on the machine's own packages (the rows record which)"
fi
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
if [ -n "${1:-}" ]; then
    cp "$1" "$OUT/cuda_truth.jsonl"  # the rows an earlier run kept: --resume skips them
fi
export PYTHONUNBUFFERED=1
python3 bench/cuda_truth.py --out "$OUT/cuda_truth.jsonl" --budget-s "${BUDGET_S:-300}" --resume 2>&1 \
    | tee "$OUT/log.txt"
if [ -s "$OUT/cuda_truth.jsonl" ]; then
    python3 bench/cuda_truth.py --compare "$OUT/cuda_truth.jsonl" 2>&1 | tee "$OUT/compare.txt"
fi
