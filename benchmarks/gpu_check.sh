#!/usr/bin/env bash
# Issues 52 and 60's GPU check as one device call, from a freshly started machine, within seven minutes
# (a lease is fifteen, start-up included): the figures first, each printed as it is measured
# (benchmarks/gpu_check.py), then the `cuda` tests, then the scaling stage. Everything under
# $OUT (what a device call brings back). From the checkout's root, with .device/ carried
# (../shared/device/make-bundle.sh . builds it; the authors' src/inversion_optimisation/ under
# .device/authors/src/ to time their code):
#
#   source .device/setup.sh && bash benchmarks/gpu_check.sh
#
# BUDGET (seconds for stages 0-4, default 270; stage 0, the fused kernels, first) and SCALE_S (stage 5, default 80).
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
began=$SECONDS
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
authors=()
if [ -d .device/authors/src/inversion_optimisation ]; then
    here=$PWD
    authors=(--authors-cmd "cd $here/.device/authors && PYTHONPATH=$here/.device/authors/stubs:/tmp/site:$here/.device/authors/src python3 run_authors.py {n} {B} {steps} cuda")
fi
python3 benchmarks/gpu_check.py --budget "${BUDGET:-270}" --stages 01234 ${authors[@]+"${authors[@]}"} \
    2>&1 | grep -v -e "^Loading" -e "it/s\]" | tee "$OUT/check.log"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_executor.py 2>&1 \
    | tail -4 | tee "$OUT/cuda-tests.log"
python3 benchmarks/gpu_check.py --budget "${SCALE_S:-80}" --stages 5 2>&1 \
    | grep -v -e "^Loading" -e "it/s\]" | tee "$OUT/scaling.log"
echo "gpu_check.sh: $((SECONDS - began)) s in all" | tee -a "$OUT/check.log"
