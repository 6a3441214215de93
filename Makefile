# llmlab: `make run` trains the default model and samples from it; `make test` runs the tests.
#
# Commands run in the active virtual environment (or conda env) when there is one,
# otherwise in ./.venv, which `make install` creates.

ifneq ($(VIRTUAL_ENV),)
  BIN := $(VIRTUAL_ENV)/bin/
else ifneq ($(CONDA_PREFIX),)
  BIN := $(CONDA_PREFIX)/bin/
else
  BIN := $(CURDIR)/.venv/bin/
endif
PYTHON := $(BIN)python
LLMLAB := $(PYTHON) -m llmlab
PROMPT ?= def fib(
SHAKESPEARE ?= ../shared/data/tinyshakespeare.txt
NANOGPT ?=
# NANOGPT: a nanoGPT checkout; when set, make bench times its train.py beside llmlab (bench.shakespeare)

.PHONY: install run test test-all fuzz bench bench-long bench-gpu clean distclean

install:  ## editable install with the test extra; does nothing when already installed
	@if [ ! -x "$(PYTHON)" ]; then echo "creating .venv"; python3 -m venv .venv; fi
	@if $(PYTHON) -c "import llmlab, pytest, scipy, xdist, sys; sys.exit(0 if llmlab.__file__.startswith('$(CURDIR)/') and tuple(map(int, xdist.__version__.split('.')[:2])) >= (3, 8) else 1)" 2>/dev/null; then \
		echo "llmlab is installed in $(BIN)"; \
	else \
		$(PYTHON) -m pip install -e ".[test]"; \
	fi

run: install  ## prepare the stdlib corpus, train the default model on this machine, print a sample
	$(LLMLAB) train
	$(LLMLAB) sample ckpt=latest prompt="$(PROMPT)" max_new_tokens=120

# Test files spread over up to 4 processes (pytest-xdist; one per core on a smaller machine).
# A file stays in one process, so its module fixtures (a trained run, a sweep) are built once.
# The files go out longest first, in the order tests/conftest.py gives them (xdist would
# otherwise sort them by their number of tests).
PARALLEL := -n auto --maxprocesses=4 --dist loadfile --no-loadscope-reorder

test: install  ## the fast suite
	$(PYTHON) -m pytest -q $(PARALLEL)

test-all: install  ## everything, slow end-to-end runs included
	$(PYTHON) -m pytest -q $(PARALLEL) -m "slow or not slow"

fuzz: install  ## the input fuzzer: N mutated inputs (default 200), a random seed unless SEED=...; prints a table of outcomes
	$(PYTHON) -m tests.fuzz.cases --cases $(or $(N),200)$(if $(SEED), --seed $(SEED))

bench: install  ## benchmarks; results go to bench/results/
	$(PYTHON) -m bench.tokenize_speed --shakespeare "$(SHAKESPEARE)"
	$(PYTHON) -m bench.long_line
	$(PYTHON) -m bench.attention
	$(PYTHON) -m bench.sparse_attention
	$(PYTHON) -m bench.context_parallel
	$(PYTHON) -m bench.train_default
	$(PYTHON) -m bench.shakespeare --data "$(SHAKESPEARE)"$(if $(NANOGPT), --nanogpt "$(NANOGPT)" --rounds 3)
	$(PYTHON) -m bench.speculative
	$(PYTHON) -m bench.decode_vs_hf$(if $(wildcard $(SHAKESPEARE)), --data "$(SHAKESPEARE)")
	$(PYTHON) -m bench.decode_busy$(if $(wildcard $(SHAKESPEARE)), --data "$(SHAKESPEARE)")
	$(PYTHON) -m bench.head_loss
	$(PYTHON) -m bench.activation_checkpointing
	$(PYTHON) -m bench.cli

bench-long: install  ## the hour-long studies: tokenize at 200 MB / 1 GB / 2 GB, the default recipe's search, muP's learning-rate transfer, IsoFLOP studies (one of cooldown branches, and what branches save) and the pooled hold-out table
	$(PYTHON) -m bench.tokenize_scale --train-speed
	$(PYTHON) -m bench.default_search
	$(PYTHON) -m bench.mup_transfer
	$(PYTHON) -m bench.isoflop --jobs 2
	$(PYTHON) -m bench.branch_cost
	$(PYTHON) -m bench.branch_study --jobs 2
	$(PYTHON) -m bench.holdout_forms

bench-gpu: install  ## GPT-2-124M on one CUDA GPU against a plain PyTorch loop, and its kernel-time split; results go to bench/results/
	$(PYTHON) -m bench.cuda_check
	$(PYTHON) -m bench.gpu --batch-size 32
	$(PYTHON) -m bench.gpu_probe --variants base,flash --profile --name gpu_probe_attention
	$(PYTHON) -m bench.gpu_probe --variants base,plainloss,bs64 --profile --name gpu_probe_head_loss
	$(PYTHON) -m bench.decode_vs_hf --gpt2 --device cuda --precision bf16 --name gpt2_cuda_bf16
	$(PYTHON) -m bench.head_loss
	$(PYTHON) -m bench.activation_checkpointing
	$(PYTHON) -m bench.cli

clean:  ## run outputs, prepared data and build leftovers (keeps .venv)
	rm -rf outputs multirun wandb .cache .pytest_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -not -path "./.venv/*" -exec rm -rf {} +

distclean: clean
	rm -rf .venv
