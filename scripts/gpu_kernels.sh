#!/usr/bin/env bash
# On a CUDA machine: the GPU tests of our kernels and their tactics, the per-layer convolution sweep against
# cuDNN, and the ResNet-50 engine against eager PyTorch. Each stage has a time limit (seconds, env overridable).
# Usage: scripts/gpu_kernels.sh OUTPUT_DIR
set -uo pipefail
out=${1:?output directory}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader > "$out/device.txt"
timeout "${TEST_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider ${TEST_ARGS:-} tests/kernels tests/tactics \
  tests/runtime tests/build 2>&1 | tail -40 > "$out/pytest_kernels_gpu.txt"
tail -5 "$out/pytest_kernels_gpu.txt"
timeout "${SWEEP_S:-200}" python3 bench/conv_sweep.py ${SWEEP_ARGS:---model resnet50 --batch 1 --batch 64 --effort 0} \
  --out "$out" 2>&1 | grep -E '^\{|Our kernels win' | tail -8
if [ "${ENGINE:-1}" = 1 ]; then
  timeout "${ENGINE_S:-200}" python3 bench/engine_vs_eager.py --model resnet50 --batch 1 --batch 256 --out "$out" \
    2>&1 | tail -14
fi
