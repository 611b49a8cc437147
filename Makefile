# Two commands get a newcomer going: `make install` then `make test`; `make bench` runs the default suite.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# A CPU-only machine takes this CPU build; on a GPU machine install a CUDA torch first (it is kept).
TORCH ?= torch==2.13.0

.PHONY: install test test-gpu bench envelope list status clean

install:
	$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH)"
	$(PIP) install -e ".[test]"

test:
	$(PYTHON) -m pytest

# On a GPU, after any change to kernels/: every candidate config forced, replayed from a CUDA graph; then
# the kernels tuned across their envelope (exit 1 on a row that fails its check or errors)
test-gpu:
	$(PYTHON) -m pytest tests/test_kernel_chunk_gpu.py tests/test_kernel_chunk_walk_sm90.py tests/test_kernel_chunk_prep_sm90.py \
		tests/test_kernel_recurrent_gpu.py
	gdnbench run kernel-check --strict

bench:
	gdnbench run smoke

# On a GPU: every bundled path beside every installed peer across the kernels' envelope (suites/envelope.yaml)
envelope:
	gdnbench run envelope

list:
	gdnbench list

# docs/status.md from results/baselines/ (tests/test_status_page.py fails while it is stale)
status:
	$(PYTHON) -m gdnbench.status_page docs/status.md

clean:
	rm -rf build *.egg-info .pytest_cache
