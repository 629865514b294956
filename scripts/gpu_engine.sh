#!/usr/bin/env bash
# On a CUDA machine: the engine's GPU tests, the ResNet-50 engine benchmark and the orientation demo.
# Usage: scripts/gpu_engine.sh OUTPUT_DIR
set -uo pipefail
out=${1:?output directory}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader > "$out/device.txt"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/build tests/runtime tests/tactics tests/ir 2>&1 | tail -30 > "$out/pytest_engine_gpu.txt"
tail -3 "$out/pytest_engine_gpu.txt"
python3 bench/engine_vs_eager.py --model resnet50 --batch 1 --batch 256 --out "$out" 2>&1 | tail -20
python3 examples/orientation.py --device cuda > "$out/demo_cuda.txt" 2>&1
tail -4 "$out/demo_cuda.txt"
if [ "${FULL_GPU_TESTS:-0}" = 1 ]; then
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -40 > "$out/pytest_gpu_all.txt"
  tail -3 "$out/pytest_gpu_all.txt"
fi
