#!/usr/bin/env bash
# LLaMA-Factory's own virtual environment for tests/formats/test_validate.py (it pins transformers,
# peft and trl versions other than memfit's). About 3-4 minutes and 2.2 GB on a clean machine.
#   torch first (the CPU build the machine serves), then LLaMA-Factory and DeepSpeed with torch held at
#   that version (else pip pulls a CUDA torch), then drop torchvision: the PyPI build does not match
#   the CPU torch and breaks `import transformers`; LLaMA-Factory's text training does not need it.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${MEMFIT_LLAMAFACTORY_VENV:-.venvs/llamafactory}"
# liger-kernel's metadata only: get_train_args checks it is installed when a YAML sets enable_liger_kernel
# (memfit plans it); its Triton kernels never run in a parser check, so no dependencies
LIGER="liger-kernel==0.8.5"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import llamafactory" 2>/dev/null; then
    "$VENV/bin/python" -c "import importlib.metadata as m; m.version('liger-kernel')" 2>/dev/null \
        || "$VENV/bin/pip" install -q --no-deps "$LIGER"
    exit 0
fi
python -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.13.0
PIN="$(mktemp)"; echo "torch==2.13.0" > "$PIN"
"$VENV/bin/pip" install -q llamafactory==0.9.5 deepspeed==0.19.8 -c "$PIN"
"$VENV/bin/pip" uninstall -q -y torchvision
rm -f "$PIN"
"$VENV/bin/pip" install -q --no-deps "$LIGER"
