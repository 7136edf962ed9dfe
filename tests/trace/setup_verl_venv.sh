#!/usr/bin/env bash
# verl's own virtual environment (tests/formats verl launches: Hydra composes verl's configs; tests/trace: verl's
# FSDP worker code on gloo ranks). verl 0.9.1 pins transformers <5.11, memfit runs 5.24, so it lives apart. It sees
# the main environment's packages (--system-site-packages: torch 2.13.0, peft, accelerate) and adds verl without
# its GPU-side dependencies (vLLM and SGLang are not imported by the config and worker code we run; Ray is, at import), Hydra, and
# transformers 5.10.4 (the newest release verl 0.9.1 accepts).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${MEMFIT_VERL_VENV:-.venvs/verl}"
VERL="verl==0.9.1"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import verl, hydra, omegaconf, tensordict, ray" 2>/dev/null; then
    exit 0
fi
python -m venv --system-site-packages "$VENV"
PIN="$(mktemp)"; echo "torch==2.13.0" > "$PIN"
"$VENV/bin/pip" install -q --no-deps "$VERL"
"$VENV/bin/pip" install -q hydra-core==1.3.8 omegaconf==2.3.0 transformers==5.10.4 "tensordict==0.10.0" ray==2.60.0 codetiming dill \
    pylatexenc -c "$PIN"
rm -f "$PIN"
