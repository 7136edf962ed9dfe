#!/usr/bin/env bash
# The frameworks whose pins clash with memfit's live in their own venvs under .venvs/ (each script says why):
# LLaMA-Factory (tests/formats), torchtune, LitGPT, fms-acceleration's benchmark releases and verl (tests/trace). Each
# script returns at once when its venv is already built. Then DeepSpeed's CPU ops, compiled once here rather than
# inside the first engine test of each pytest worker.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/formats/setup_llamafactory_venv.sh
bash tests/trace/setup_torchtune_venv.sh
bash tests/trace/setup_litgpt_venv.sh
bash tests/trace/setup_fms_venv.sh
bash tests/trace/setup_verl_venv.sh
python tests/measure/build_deepspeed_ops.py
