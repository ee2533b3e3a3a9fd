source .device/setup.sh >/dev/null 2>&1; export PYTHONUNBUFFERED=1; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 -c "import torch;print(torch.__version__)"
G="python3 benchmarks/graph_step.py --device cuda"
timeout 90 $G --steps 20 --full --case qwen:3:64 --precision float32 --precision tf32 --precision bfloat16 2>&1 | grep -v Loading | tee $OUT/g1.log
timeout 40 $G --steps 20 --case qwen:3:64 --precision tf32 2>&1 | grep -v Loading | tee $OUT/g2.log
timeout 80 $G --steps 10 --full --case qwen:3:256 --case neo:10:1000 --precision float32 --precision tf32 2>&1 | grep -v Loading | tee $OUT/g3.log
timeout 90 $G --steps 6 --full --case qwen3b:3:256 --precision tf32 --precision bfloat16 2>&1 | grep -v Loading | tee $OUT/g4.log
timeout 70 python3 benchmarks/precision_finds.py --device cuda --case stories:3:256:300 --case neo:1:256:200 2>&1 | grep -v Loading | tee $OUT/p.log
