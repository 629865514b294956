#!/usr/bin/env bash
# On a CUDA machine: the engine, kernel, tool and serving GPU tests, the ResNet-50 engine benchmark, the serving
# load test and the orientation demo. FULL_GPU_TESTS=1 adds the whole `pytest -m gpu` suite.
# Usage: scripts/gpu_engine.sh OUTPUT_DIR
set -uo pipefail
out=${1:?output directory}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader > "$out/device.txt"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels tests/tactics tests/build tests/runtime tests/cli \
  tests/ir tests/serve tests/passes tests/test_compare.py 2>&1 | tail -30 > "$out/pytest_engine_gpu.txt"
tail -3 "$out/pytest_engine_gpu.txt"
python3 bench/engine_vs_eager.py --model resnet50 --batch 1 --batch 256 --out "$out" 2>&1 | tail -20
python3 bench/serve_load.py --model resnet50 --max-batch 32 --clients 32 --requests 1024 --out "$out" 2>&1 | tail -5
python3 examples/orientation.py --device cuda > "$out/demo_cuda.txt" 2>&1
tail -2 "$out/demo_cuda.txt"
if [ "${FULL_GPU_TESTS:-0}" = 1 ]; then
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -40 > "$out/pytest_gpu_all.txt"
  tail -3 "$out/pytest_gpu_all.txt"
fi
