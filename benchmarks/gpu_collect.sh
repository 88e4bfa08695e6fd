#!/usr/bin/env bash
# Measure a lent GPU with `tilesim kernels collect`, within one device call (issue 5).
#
# The lent machine (docs: the device tool's KINDS.md) has python3 with PyTorch and CUDA (torch
# 2.11 there when last read, not the 2.13 that pyproject pins: so the project runs from this
# checkout on PYTHONPATH, no `pip install -e .`, which would need the pin and a network),
# numpy, pandas, networkx and matplotlib, but not pydantic, and it reaches no network, so
# pydantic and its needs travel as wheels:
#
#   here, once:   bash benchmarks/gpu_collect.sh --fetch-wheels
#                 (pydantic's wheels into .whl/, git-ignored; the label runs' model configs
#                 from ../shared into .gpu_models/, which .git/info/exclude must ignore)
#   on the GPU:   device run, carry [".whl", ".gpu_models"], timeout_s 540, command:
#                 BUDGET_S=330 bash benchmarks/gpu_collect.sh
#   back here:    cp <files_at>/*.csv <files_at>/*.meta.json forecast/data/measured/
#                 tilesim kernels tc-calibrate --measured forecast/data/measured/*.csv
#                 python benchmarks/gpu_e2e.py --compare <files_at>/e2e.jsonl
#
# After the collector, where .gpu_models/ travelled and the image has transformers,
# benchmarks/gpu_e2e.py times the NVIDIA label runs (Hugging Face eager, fp32 and bf16) on the
# same GPU within E2E_BUDGET_S (default 90 s): $OUT/e2e.jsonl and $OUT/e2e.log.
#
# Writes $OUT/<gpu>.csv (NeuSight's kernel-table columns + dtype), its .meta.json (GPU, SMs,
# L2, memory, driver, clocks idle and after the run, torch/CUDA/cuDNN versions, timing method)
# and $OUT/collect.log. BUDGET_S (default 420 s) bounds the collection: a kernel starts only
# if its first warm-up call shows it ends within it, and a guard stops the collector (rows are
# written whole, one at a time) 30 s past it, so the whole call stays under 8 minutes. The
# plan covers every op and dtype at its first shape before any second shape, so a short
# budget still measures all of them; shapes that outgrow the GPU's memory are skipped and
# listed. Run it again on the same $OUT to resume. DEVICE=cpu runs the same path on the CPU
# (how this script is tested); PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [[ "${1:-}" == "--fetch-wheels" ]]; then
    mkdir -p .whl
    # pydantic and its own needs, for the lent machine's CPython 3.12 on x86-64; pydantic
    # 2.14 needs typing-extensions >= 4.16, newer than the image may hold
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl \
        "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0" \
        "typing-inspection==0.4.5" "typing-extensions==4.16.0"
    ls .whl
    mkdir -p .gpu_models
    for m in bert_large gpt2_large gpt3_xl gpt3_27 opt_13; do
        cp "${DATA:-../shared/data/neusight}/models/$m.json" .gpu_models/
    done
    git check-ignore -q .gpu_models || echo "/.gpu_models/" >>.git/info/exclude
    ls .gpu_models
    exit 0
fi

OUT=${OUT:-results/collect}
DEVICE=${DEVICE:-cuda}
BUDGET_S=${BUDGET_S:-420}
mkdir -p "$OUT"
LOG="$OUT/collect.log"
: >"$LOG"
if ! "$PYTHON" -c "import pydantic" 2>/dev/null; then
    if ! compgen -G ".whl/*.whl" >/dev/null; then
        echo "gpu_collect.sh: pydantic is missing and .whl/ has no wheels; run" \
            "'bash benchmarks/gpu_collect.sh --fetch-wheels' here and carry .whl" | tee -a "$LOG"
        exit 2
    fi
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
        --format=csv 2>&1 | tee -a "$LOG" || true
fi
status=0
timeout --signal=INT --kill-after=15 "$((${BUDGET_S%.*} + 30))" \
    "$PYTHON" -m simulator kernels collect --device "$DEVICE" --out "$OUT/$gpu.csv" \
    --budget-s "$BUDGET_S" 2>&1 | tee -a "$LOG" || status=$?
echo "collector exit status $status; rows (header included): $(wc -l <"$OUT/$gpu.csv" 2>/dev/null || echo none)" |
    tee -a "$LOG"
if [[ -d .gpu_models ]] && "$PYTHON" -c "import transformers" 2>/dev/null; then
    e2e_budget=${E2E_BUDGET_S:-90}
    timeout --signal=INT --kill-after=10 "$((${e2e_budget%.*} + 15))" \
        "$PYTHON" benchmarks/gpu_e2e.py --models .gpu_models --out "$OUT/e2e.jsonl" \
        --device "$DEVICE" --budget-s "$e2e_budget" ${E2E_ARGS:-} 2>&1 | tee "$OUT/e2e.log" ||
        echo "gpu_e2e.py exit status $?" | tee -a "$OUT/e2e.log"
fi
exit "$status"
