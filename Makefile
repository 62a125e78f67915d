# Every target sets up .venv itself, so a fresh machine needs only `make demo` or `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.flaxport-installed
# torch first and pinned: anything that later asks for `torch` is then satisfied and
# never pulls the multi-gigabyte CUDA build.
TORCH  := torch==2.13.0
# Test files run in parallel, one file per worker (module-scoped runs stay shared): most
# of the suite is single-threaded XLA compiles and subprocess start-ups.
TEST_WORKERS ?= 2

.PHONY: setup demo test test-all bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[torch,keras,dev]"
	$(PY) -c "from flaxport import kernels; kernels.available()"  # build the FFI convs now, not in a first epoch
	touch $(STAMP)

# The GAN in both frameworks, side by side, ending in runs/demo-gan/compare.png. `quick` is the
# tuned recipe in ~6k cheap steps; `make demo CONFIG=default` runs the seed article's reference
# settings instead (which learn the mixture poorly, as the article says).
CONFIG ?= quick
demo: setup
	$(VENV)/bin/flaxport compare gan --config $(CONFIG) --epochs 20 --runs torch-tuned,jax-scan --workdir runs/demo-gan

test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=10

bench: setup
	$(VENV)/bin/flaxport compare gan --epochs 10 --workdir runs/bench-gan
	$(VENV)/bin/flaxport compare cnn --epochs 5 --seeds 3 --workdir runs/bench-cnn
	$(PY) -m flaxport.bench.ddim_sampling --rounds 5 --json runs/bench-ddim-sampling.json

clean:
	rm -rf $(VENV) runs .pytest_cache
