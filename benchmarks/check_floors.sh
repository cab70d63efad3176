#!/usr/bin/env bash
# The version floors of setup.cfg, tested: a second environment with exactly the lowest
# versions setup.cfg admits (the peft extra's included), then the resume, agreement, start-up,
# fault, text-recipe, EMA, frozen-discriminator, adapter, dataset and model-loading tests in it.
#
#     bash benchmarks/check_floors.sh [VENV_DIR]        (default: .venv-floors)
#
# The torch floor comes from the package index as a CUDA build (about 3 GB with its nvidia
# wheels; it runs on the CPU): only torch 2.13.0 has a CPU build on this project's machines.
# So .ci/run does not run this script; run it whenever a floor or a version-sensitive call
# changes, and record the date and the result in the README ("Install").
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-floors}"

# The floors, read from setup.cfg's install_requires (name>=version).
floors=$(python3 - <<'EOF'
import configparser
cfg = configparser.ConfigParser()
cfg.read("setup.cfg")
lines = cfg["options"]["install_requires"].strip().splitlines()
lines += cfg["options.extras_require"]["peft"].strip().splitlines()  # an optional extra, tested too
for line in lines:
    name, _, version = line.strip().partition(">=")
    print(f"{name}=={version}")
EOF
)

python3 -m venv "$venv"
. "$venv/bin/activate"
pip install --quiet --upgrade pip
pip install --quiet $floors "pytest>=8" "pytest-timeout>=2.3"
pip install --quiet --no-deps -e .
echo "floor environment:"
pip list 2>/dev/null | grep -i -E '^(torch|accelerate|transformers|datasets|safetensors|pyyaml|tqdm|peft) '
export OMP_NUM_THREADS=1
python -m pytest -q -p no:cacheprovider tests/test_resume.py tests/test_agreement.py tests/test_startup.py \
    tests/test_one_rank_errors.py tests/test_run_ownership.py tests/test_faults.py tests/test_text.py \
    tests/test_ema.py tests/test_frozen_discriminator.py tests/test_peft.py tests/test_text_datasets.py tests/test_model_loading.py
