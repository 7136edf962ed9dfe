#!/usr/bin/env bash
# LitGPT's own virtual environment for memfit/trace/litgpt.py and tests/trace/test_litgpt.py (litgpt pins
# huggingface-hub<1.4, memfit pins 2.4.0). About a minute and 30 MB on top of the system packages.
#   --system-site-packages: torch 2.13.0 and lightning 2.6.6 (and memfit itself) come from the system
#   interpreter; they are held at those versions so pip never pulls another (CUDA) torch.
#   transformers in LitGPT's own range: `import lightning` reaches torchmetrics, which imports any
#   installed transformers, and the system's 5.x cannot load with the hub LitGPT pins.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${MEMFIT_LITGPT_VENV:-.venvs/litgpt}"
LITGPT="litgpt==0.5.13"
TRANSFORMERS="transformers==4.56.2"  # in litgpt 0.5.13's [extra] range (>=4.51.3,<4.57)
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import litgpt.lora, litgpt.finetune.lora" 2>/dev/null; then
    exit 0
fi
python -m venv --system-site-packages "$VENV"
PIN="$(mktemp)"
python - > "$PIN" <<'PY'
import importlib.metadata as m
for name in ("torch", "lightning", "lightning-utilities", "pytorch-lightning"):
    print(f"{name}=={m.version(name)}")
PY
"$VENV/bin/pip" install -q "$LITGPT" "$TRANSFORMERS" -c "$PIN"
rm -f "$PIN"
