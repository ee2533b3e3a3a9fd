#!/usr/bin/env bash
# Issue 41's GPU measurements as one device call, most wanted first, each stage bounded so that
# a slow one cannot starve the next, everything written under $OUT (what a device call brings
# back). On the GPU machine, from the checkout's root, with .device/ carried
# (../shared/device/make-bundle.sh . builds it; put the authors' src/inversion_optimisation/
# under .device/authors/src/ to time their code too):
#
#   source .device/setup.sh && bash benchmarks/gpu_session.sh
#
# Stage limits in seconds (SUITE_S, GRAPH_S, PLAN_S, SCAN_S; 350 + 90 + 100 + 40 by default)
# leave about 20 s of a 600-second call for the set-up; the suite takes 12 steps a case (20 in the H200
# figures of 2026-11-26) to fit three precisions. What the H200 lease of 2026-11-26 taught (RESULTS.md):
# - Qwen n=3 B=1000 comes first: recording its 1,000 targets alone takes about 30 s of 24-layer
#   forwards before its steps (issue 37's canonical shape), and last it was never reached;
# - tf32 (float32 state, tensor-core products) was never measured: the suite now runs it;
# - the graph prototype's tokens differed from eager ones: "repeat same" now says whether the
#   eager step is itself repeatable there.
set -u
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" \
    >>"$OUT/gpu.txt" 2>&1

authors=()
if [ -d .device/authors/src/inversion_optimisation ]; then
    here=$PWD
    authors=(--authors-cmd "cd $here/.device/authors && PYTHONPATH=$here/.device/authors/stubs:/tmp/site:$here/.device/authors/src python3 run_authors.py {n} {B} {steps} cuda")
fi
timeout "${SUITE_S:-350}" python3 benchmarks/bench_invert.py --suite gpu --device cuda --steps 12 \
    --case qwen:3:1000 --case qwen:3:64 --case neo:10:1000 --case neo:10:64 \
    ${authors[@]+"${authors[@]}"} \
    --out "$OUT/costs.yaml" --json "$OUT/suite.jsonl" 2>&1 | tee "$OUT/suite.log"

timeout "${GRAPH_S:-90}" python3 benchmarks/graph_step.py --device cuda --steps 20 \
    --case qwen:3:64 --case qwen:3:1000 2>&1 | tee "$OUT/graph.log"

costs=$OUT/costs.yaml
[ -f "$costs" ] || costs=h200
timeout "${PLAN_S:-100}" python3 benchmarks/plan_vs_wall.py --device cuda --costs "$costs" 2>&1 \
    | tee "$OUT/planwall.log"

# Issue 38's position scan: what one position's scan of Qwen's 151,936 tokens costs on the GPU,
# in SODA sample-steps (on this 2-core CPU: about 5,000 at neo's 50,257, 6,600 at SmolLM2's).
timeout "${SCAN_S:-40}" python3 benchmarks/position_scan.py --cost-shape qwen --device cuda \
    2>&1 | tee "$OUT/scan.log"
