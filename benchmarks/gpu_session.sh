#!/usr/bin/env bash
# Issue 41's GPU measurements as one device call, most wanted first, each stage bounded so that
# a slow one cannot starve the next, everything written under $OUT (what a device call brings
# back). On the GPU machine, from the checkout's root, with .device/ carried
# (../shared/device/make-bundle.sh . builds it; put the authors' src/inversion_optimisation/
# under .device/authors/src/ to time their code too):
#
#   source .device/setup.sh && bash benchmarks/gpu_session.sh
#
# Stage limits in seconds (ROWS_S, EXEC_S, UPDATE_S, SUITE_S, STATIC_S, PLAN_S; 30 + 240 + 30 +
# 170 + 0 + 100 by default) leave about 30 s of a 600-second call for the set-up (0 skips one).
# GRAPH_S and SCAN_S (0: skipped) rerun the graph prototype and the position scan, both measured on the H100 of 2026-11-26 (RESULTS.md).
# What the H100 lease of 2026-11-26 taught:
# - the engine then padded every GPU pass to static shapes (widths of 16s), for an executor
#   that did not exist then (sodaray/search/executor.py now; stage 1): Qwen n=3 B=1000 took 731.8 ms in float32 against 194.4 ms for the
#   same arithmetic at its own width. "exact" is now the default everywhere, and "static" pads
#   a width up to 16 to a power of two only (3 -> 4); stage 3 measures the two side by side;
# - four cases in three precisions did not fit 350 s under static shapes; at their own widths
#   the Qwen cases should take about a third of that.
set -u
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" \
    >>"$OUT/gpu.txt" 2>&1

# 0. Whether the loss's unembedding may skip its padding here too (CPU only until this says so).
if [ "${ROWS_S:-30}" -gt 0 ]; then
    timeout "${ROWS_S:-30}" python3 benchmarks/unembed_rows.py --device cuda 2>&1 \
        | tee "$OUT/unembed_rows.log"
fi

# 1. The executors (issue 41: the step built once per shape and replayed); stage 2 is the same
# machine's eager baseline. Each run's warm-up builds its shapes, the timed steps replay them;
# every run measures float32 and bfloat16. graph (CUDA graphs of the eager kernels) first: it is
# what the B=64 bound hangs on; then compiled (inductor, reduce-overhead).
for executor in graph compiled; do
    [ "${EXEC_S:-240}" -gt 2 ] || break
    parts=2
    [ "$executor" = graph ] && parts=3
    share=$(( ${EXEC_S:-240} * parts / 5 ))
    timeout "$share" python3 benchmarks/bench_invert.py --suite gpu \
        --device cuda --steps 8 --precision bfloat16 --executor "$executor" \
        --case qwen:3:64 --case qwen:3:1000 --case neo:10:1000 \
        --json "$OUT/executors.jsonl" 2>&1 | grep -v -i profiler | tee -a "$OUT/executors.log"
done

# 1b. The update fused (the "compiled" executor's Adam and decay) against eager at Qwen n=3,
# B=1000: 3,000 rows of 151,936, 1.8 GB a tensor.
if [ "${UPDATE_S:-30}" -gt 0 ]; then
    timeout "${UPDATE_S:-30}" python3 benchmarks/bench_update.py --device cuda --rows 3000 \
        --repeats 8 2>&1 | tee "$OUT/update.log"
fi

authors=()
if [ -d .device/authors/src/inversion_optimisation ]; then
    here=$PWD
    authors=(--authors-cmd "cd $here/.device/authors && PYTHONPATH=$here/.device/authors/stubs:/tmp/site:$here/.device/authors/src python3 run_authors.py {n} {B} {steps} cuda")
fi
# 2. The suite at the engine's default (eager, exact policy): the targets' figures and the costs file.
timeout "${SUITE_S:-170}" python3 benchmarks/bench_invert.py --suite gpu --device cuda --steps 12 \
    --case qwen:3:1000 --case neo:10:1000 --case qwen:3:64 --case neo:10:64 \
    ${authors[@]+"${authors[@]}"} \
    --out "$OUT/costs.yaml" --json "$OUT/suite.jsonl" 2>&1 | tee "$OUT/suite.log"

# 3. Static against exact shapes on the case the old padding hurt most, float32 only.
for policy in exact static; do
    [ "${STATIC_S:-0}" -gt 1 ] || break  # 0 skips the stage (timeout 0 would mean no limit)
    timeout "$(( ${STATIC_S:-0} / 2 ))" python3 benchmarks/bench_invert.py --suite gpu \
        --device cuda --steps 6 --precision float32 --policy "$policy" --case qwen:3:1000 \
        --json "$OUT/policy.jsonl" 2>&1 | grep -v -i profiler | tee -a "$OUT/policy.log"
done

# 4. A Ray sweep against its plan, priced by the costs stage 2 fit.
costs=$OUT/costs.yaml
[ -f "$costs" ] || costs=h100
timeout "${PLAN_S:-100}" python3 benchmarks/plan_vs_wall.py --device cuda --costs "$costs" 2>&1 \
    | tee "$OUT/planwall.log"

if [ "${GRAPH_S:-0}" -gt 0 ]; then
    timeout "$GRAPH_S" python3 benchmarks/graph_step.py --device cuda --steps 20 \
        --case qwen:3:64 --case qwen:3:1000 2>&1 | tee "$OUT/graph.log"
fi
# Issue 38's position scan: one position's scan of Qwen's 151,936 tokens, in SODA sample-steps.
if [ "${SCAN_S:-0}" -gt 0 ]; then
    timeout "$SCAN_S" python3 benchmarks/position_scan.py --cost-shape qwen --device cuda \
        2>&1 | tee "$OUT/scan.log"
fi
