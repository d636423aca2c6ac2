# Two entry points for a fresh machine: `make run` (the reduced-size Table 1) and `make test`.
# Both create .venv, install the pinned requirements and the Fashion-MNIST data set if missing,
# and skip whatever is already installed.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
CORES ?= 2
CONFIG ?= experiments/ci.yaml
# pytest-xdist processes of `make test`; the multi-process tests start their own workers on top (2 suits 2 cores)
TEST_JOBS ?= 2
export OMP_NUM_THREADS ?= 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# no calls to outside servers from MLflow (the workflow's runs, mlflow ui)
export MLFLOW_DISABLE_TELEMETRY ?= true

.PHONY: run run-2bw test setup data jemalloc ui lint dry-run-paper clean-results

run: setup data jemalloc
	@$(BIN)/python -m pipedream.cli check --config $(CONFIG)
	$(BIN)/snakemake --cores $(CORES) --configfile $(CONFIG) --rerun-incomplete

# PipeDream-2BW's table (not part of `make run`): the reduced GPT with every schedule, and the paper-scale predictions
run-2bw: setup data jemalloc
	@$(BIN)/python -m pipedream.cli check --config experiments/2bw.yaml
	$(BIN)/snakemake --cores $(CORES) --configfile experiments/2bw.yaml --rerun-incomplete

test: setup data jemalloc
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist worksteal --durations=15

setup: $(STAMP)

$(STAMP): requirements.txt requirements-fairseq.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt 2>&1 | grep -v "^WARNING: Location" || true
	$(BIN)/python -c "import torch, torchvision, mlflow, snakemake, seaborn" \
	  || { echo "error: pip install -r requirements.txt failed; see the messages above" >&2; exit 1; }
	$(BIN)/pip install -q --no-build-isolation -r requirements-fairseq.txt 2>&1 | grep -v "^WARNING: Location" || true
	$(BIN)/python -c "import fairseq" \
	  || { echo "error: fairseq-fixed did not install; see the messages above" >&2; exit 1; }
	$(BIN)/pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "^WARNING: Location" || true
	touch $(STAMP)

data: $(FMNIST)
	@missing=; test -f /usr/share/trans/de-en || missing="$$missing trans-de-en"; \
	command -v bible >/dev/null || missing="$$missing bible-kjv"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; else \
	    echo "error: data packages missing and apt is not allowed here; run as root: apt-get install$$missing" >&2; exit 1; fi; \
	  $$SUDO apt-get install -y -q $$missing >/dev/null 2>&1 \
	    || { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q $$missing; } \
	    || { echo "error: could not apt-get install$$missing; install them by hand (Debian packages)" >&2; exit 1; }; \
	fi

# the workers' allocator (pipedream/allocator.py); optional: without it they keep glibc's freed memory, with a warning
jemalloc:
	@ldconfig -p 2>/dev/null | grep -q libjemalloc.so.2 && exit 0; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; else \
	  echo "warning: libjemalloc2 is missing and apt is not allowed here: the workers use glibc's malloc" >&2; exit 0; fi; \
	$$SUDO apt-get install -y -q libjemalloc2 >/dev/null 2>&1 \
	  || { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q libjemalloc2 >/dev/null; } \
	  || echo "warning: could not apt-get install libjemalloc2: the workers use glibc's malloc" >&2

$(FMNIST):
	@if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; else \
	  echo "error: Fashion-MNIST is missing and apt is not allowed here; run as root: apt-get install dataset-fashion-mnist" >&2; exit 1; fi; \
	$$SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 \
	  || { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q dataset-fashion-mnist; } \
	  || { echo "error: could not apt-get install dataset-fashion-mnist; install it by hand (Debian package)" >&2; exit 1; }
	@test -f $(FMNIST)

ui: setup
	$(BIN)/mlflow ui --backend-store-uri sqlite:///results/mlflow.db --host 127.0.0.1 --port 5000

# style (ruff), types (mypy: strict on the core, pyproject.toml [tool.mypy]), layers (import-linter contracts,
# pyproject.toml [tool.importlinter]), the workflow (snakemake --lint) and the docs (mkdocs.yml: a broken link or
# a page missing from the site fails); .ci/run runs it before the tests
lint: setup
	$(BIN)/ruff check pipedream tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/snakemake --lint --configfile $(CONFIG)
	$(BIN)/mkdocs build --strict --quiet

# the paper-scale workflow, planned but not run (shows every job a GPU cluster would execute)
dry-run-paper: setup
	$(BIN)/python -m pipedream.cli check --config experiments/table1.yaml --missing-data warn
	$(BIN)/snakemake --dry-run --quiet --cores 16 --configfile experiments/table1.yaml

clean-results:
	rm -rf results/*/ results/*.md results/*.csv results/*.html results/mlflow.db .snakemake
