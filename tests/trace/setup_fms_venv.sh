#!/usr/bin/env bash
# The releases of fms-acceleration's published A100 benchmark (foundation-model-stack/fms-acceleration 24bdadb,
# scripts/benchmarks/refs/requirements.txt) for bench/accelerate_fsdp.py's "transformers-4.48" rows and
# tests/measure/test_accelerate_fsdp.py: HF Trainer's FSDP1 path as those releases run it. It sees the main
# environment's packages (--system-site-packages: torch 2.13.0 and the rest) and replaces transformers, accelerate
# and peft with the refs' pins, with the tokenizers and huggingface-hub transformers 4.48.1 accepts (the refs' too).
#   torch held at the main environment's 2.13.0 (the refs ran 2.4.1; else pip pulls a CUDA torch): the FSDP1 code the
#   rows depend on (_runtime_utils.py _register_post_backward_reshard_only_hook, autograd/graph.py
#   register_multi_grad_hook) reads the same in the 2.4.1 wheel.
# About a minute and 40 MB on a machine with the main environment installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${MEMFIT_FMS_VENV:-.venvs/fms}"
PINS=(transformers==4.48.1 accelerate==1.0.1 peft==0.13.2 tokenizers==0.21.0 huggingface-hub==0.27.1)
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "
import accelerate, peft, transformers
assert (transformers.__version__, accelerate.__version__, peft.__version__) == ('4.48.1', '1.0.1', '0.13.2')
" 2>/dev/null; then
    exit 0
fi
python -m venv --system-site-packages "$VENV"
PIN="$(mktemp)"; echo "torch==2.13.0" > "$PIN"
"$VENV/bin/pip" install -q "${PINS[@]}" -c "$PIN"
rm -f "$PIN"
