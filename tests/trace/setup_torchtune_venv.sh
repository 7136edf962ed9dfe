#!/usr/bin/env bash
# torchtune's own virtual environment for tests/trace/test_torchtune.py and bench/torchtune.py. It sees the
# main environment's packages (--system-site-packages: torch 2.13.0, transformers, memfit's pins) and adds
# torchtune with what it needs that memfit does not pin (omegaconf, sentencepiece, tiktoken, blobfile,
# kagglehub, Pillow, torchdata, torchao), so constraints.txt stays as tools/lock.py wrote it.
#   torch held at the main environment's release (else pip pulls a CUDA torch); memfit's pins held too.
#   torchao 0.14.1: the newest release torchtune 0.6.1 imports with (0.15+ dropped torchao.dtypes.nf4tensor);
#   with torch 2.13 it skips its C++ extensions, which only quantized kernels on a GPU use.
# About a minute and 60 MB on a machine with the main environment installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${MEMFIT_TORCHTUNE_VENV:-.venvs/torchtune}"
TORCHTUNE="torchtune==0.6.1"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import torchtune, torchao" 2>/dev/null; then
    exit 0
fi
python -m venv --system-site-packages "$VENV"
PIN="$(mktemp)"; echo "torch==2.13.0" > "$PIN"
"$VENV/bin/pip" install -q "$TORCHTUNE" torchdata==0.11.0 torchao==0.14.1 -c "$PIN" -c constraints.txt
rm -f "$PIN"
