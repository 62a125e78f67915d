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
# tuned recipe in ~6k cheap steps; `make demo DEMO_CONFIG=default` runs the seed article's reference
# settings instead (which learn the mixture poorly, as the article says).
DEMO_CONFIG ?= quick
demo: setup
	$(VENV)/bin/flaxport compare gan --config $(DEMO_CONFIG) --epochs 20 --runs torch-tuned,jax-scan --workdir runs/demo-gan

# `make test` leaves out the tests marked slow (CI's budget: ~20 min on 2 cores); `make test-all` runs them too.
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=10 -m "not slow"

test-all: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=10

# Every table of docs/benchmarks.md, in one sitting (on a quiet machine: ~20 min on 2 cores, and then the
# coverage benchmark's four sources, which take hours); runs/bench/tables.md holds them in the page's
# layout (keep in step with flaxport/bench/tables.py), runs/bench/coverage-SOURCE.md the coverage tables.
BENCH := runs/bench
FLAXPORT := $(VENV)/bin/flaxport
bench: setup
	mkdir -p $(BENCH)
	$(FLAXPORT) compare gan --epochs 10 --workdir $(BENCH)/gan
	$(FLAXPORT) compare gan --config quick --epochs 20 --runs torch-tuned,jax-scan --workdir $(BENCH)/gan-quick
	$(FLAXPORT) compare gan --config tuned --epochs 40 --runs torch-tuned,jax-scan --workdir $(BENCH)/gan-tuned
	for v in tuned compiled; do rm -rf $(BENCH)/gan-torch-$$v; \
	  $(FLAXPORT) train gan --framework torch --torch-variant $$v --epochs 3 --workdir $(BENCH)/gan-torch-$$v --no-progress || exit 1; done
	for d in 1 4; do for r in scan step; do rm -rf $(BENCH)/gan-$${d}dev-$$r; \
	  XLA_FLAGS=--xla_force_host_platform_device_count=4 $(FLAXPORT) train gan --config bench --set batch_size=20 \
	    --epochs 4 --devices $$d --runner $$r --workdir $(BENCH)/gan-$${d}dev-$$r --no-progress || exit 1; done; done
	$(FLAXPORT) compare cnn --epochs 5 --seeds 3 --workdir $(BENCH)/cnn
	$(FLAXPORT) compare vae --epochs 10 --workdir $(BENCH)/vae
	test -f $(BENCH)/mnist-shaped/binarized_mnist_test.amat || $(PY) -c "from flaxport.data import binarized_mnist as b; \
	  b.write_fixture('$(BENCH)/mnist-shaped', 50000, 10000, 10000)"  # random bits in MNIST's shape: speed only
	$(FLAXPORT) compare vae --data binarized_mnist --data-dir $(BENCH)/mnist-shaped --epochs 3 --set iwae_k=5 \
	  --workdir $(BENCH)/vae-mnist-shaped
	$(FLAXPORT) env --gemm 128,784,500 > $(BENCH)/gemm.txt
	$(FLAXPORT) compare ddim --config bench --epochs 2 --runs torch-eager,torch-tuned,jax-step --workdir $(BENCH)/ddim
	$(PY) -m flaxport.bench.ddim_sampling --rounds 5 --json $(BENCH)/ddim-sampling.json
	$(PY) -m flaxport.bench.translate --json $(BENCH)/translate.json  # docs/translate.md
	$(PY) -m flaxport.bench.translate --train --json $(BENCH)/translate-train.json  # docs/translate.md
	$(FLAXPORT) compare gan --config bench --seeds 32 --epochs 3 --sequential-seeds 4 \
	  --runs jax-scan,jax-vmap,torch-tuned,torch-vmap --workdir $(BENCH)/gan-vmap  # docs/vmap.md
	$(FLAXPORT) compare vae --config bench --seeds 8 --epochs 5 --sequential-seeds 4 \
	  --runs jax-scan,jax-vmap,torch-tuned,torch-vmap --workdir $(BENCH)/vae-vmap
	$(PY) -m flaxport.bench.tables $(BENCH) > $(BENCH)/tables.md
	@echo "wrote $(BENCH)/tables.md"
	for s in opinfo hf timm torchvision; do \
	  $(PY) -m flaxport.bench.coverage --source $$s --peer torchax --timeout 300 --json $(BENCH)/coverage-$$s.jsonl \
	    > $(BENCH)/coverage-$$s.md || exit 1; done  # docs/translate.md, Coverage: hours on 2 cores
	@echo "wrote $(BENCH)/coverage-*.md"

clean:
	rm -rf $(VENV) runs .pytest_cache
