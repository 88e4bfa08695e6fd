#!/usr/bin/env bash
# Measure a lent GPU with `tilesim kernels collect`, within one device call (issue 5).
#
# The lent machine's python3 holds PyTorch with CUDA, numpy, pandas, networkx and matplotlib
# but not pydantic, and it reaches no network, so pydantic travels as wheels:
#
#   here, once:   bash benchmarks/gpu_collect.sh --fetch-wheels      (into .whl/, git-ignored)
#   on the GPU:   device run, carry [".whl"], timeout_s 540, command:
#                 bash benchmarks/gpu_collect.sh
#   back here:    cp <files_at>/*.csv <files_at>/*.meta.json forecast/data/measured/
#                 tilesim kernels tc-calibrate --measured forecast/data/measured/*.csv
#
# Writes $OUT/<gpu>.csv (NeuSight schema + dtype, kernel name, launch dims), its .meta.json
# (GPU, clocks, driver, torch and CUDA versions) and $OUT/collect.log. BUDGET_S (default
# 420 s) bounds the collection; the plan covers every op and dtype at its first shape before
# any second shape, so a short budget still measures all of them. DEVICE=cpu runs the same
# path on the CPU (how this script is tested); PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [[ "${1:-}" == "--fetch-wheels" ]]; then
    mkdir -p .whl
    # pydantic and its own needs, for the lent machine's CPython 3.12 on x86-64
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl \
        "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0" \
        "typing-inspection==0.4.5"
    ls .whl
    exit 0
fi

OUT=${OUT:-results/collect}
DEVICE=${DEVICE:-cuda}
BUDGET_S=${BUDGET_S:-420}
mkdir -p "$OUT"
if ! "$PYTHON" -c "import pydantic" 2>/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

gpu=$("$PYTHON" - "$DEVICE" <<'EOF'
import re, sys
import torch
name = torch.cuda.get_device_name() if sys.argv[1] == "cuda" else "cpu"
print(re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower())
EOF
)
if [[ "$DEVICE" == "cuda" ]]; then
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit \
        --format=csv 2>&1 | tee "$OUT/collect.log"
fi
"$PYTHON" -m simulator kernels collect --device "$DEVICE" --out "$OUT/$gpu.csv" \
    --budget-s "$BUDGET_S" 2>&1 | tee -a "$OUT/collect.log"
wc -l "$OUT/$gpu.csv" | tee -a "$OUT/collect.log"
