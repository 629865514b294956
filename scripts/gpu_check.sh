#!/usr/bin/env bash
# On a CUDA machine: the GPU-marked tests, the conformance suite on CUDA and the orientation example.
# Usage: scripts/gpu_check.sh OUTPUT_DIR
set -uo pipefail
out=${1:?output directory}
mkdir -p "$out/conformance"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/device.txt"
python3 -c "import torch, onnx; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'onnx', onnx.__version__)" >> "$out/device.txt"
python3 -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -40 > "$out/pytest_gpu.txt"
python3 -m tensorforge.conformance --device cuda -v --write "$out/conformance" > "$out/conformance_cuda.txt" 2>&1
python3 examples/orientation.py --device cuda > "$out/demo_cuda.txt" 2>&1
tail -3 "$out/pytest_gpu.txt" "$out/conformance_cuda.txt" "$out/demo_cuda.txt"
