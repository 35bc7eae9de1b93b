# idckit: every set-up step lives here, so a fresh clone needs only `make reproduce` or `make test`.
# Both are idempotent: the venv is rebuilt only when pyproject.toml changes, finished runs are cached.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.idckit-installed
PROFILE ?= cpu
DATA_ROOT ?=
NOTEBOOKS ?=
export HF_HUB_OFFLINE ?= 1
export PYTHONHASHSEED = 0

.PHONY: help setup reproduce test lab bench clean-reports check-java

help:
	@echo "make reproduce   set up .venv and run every notebook into reports/ (PROFILE=$(PROFILE); smoke|cpu|paper)"
	@echo "make test        set up .venv and run the test suite"
	@echo "make lab         open JupyterLab with the idckit kernel"
	@echo "make bench       run the benchmarks in bench/"

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "idckit: Java is required (pycocoevalcap's METEOR and PTB tokenizer run on the JVM) but 'java' is not on PATH."; \
	  echo "        fix: sudo apt-get install -y default-jre-headless   (or any Java >= 8 on PATH)"; exit 1; }

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "idckit: $(PYTHON) not found; install Python 3.11 or pass PYTHON=/path/to/python3.11"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch/torchvision are pinned in pyproject.toml to the wheels this machine has on disk.
	$(PY) -m pip install --quiet -e .
	# The kernelspec stays inside the venv (never --user) so notebooks run with the kit's own interpreter.
	$(PY) -m ipykernel install --sys-prefix --name idckit --display-name "Python (idckit)" >/dev/null
	touch $(STAMP)

setup: check-java $(STAMP)

reproduce: setup
	$(PY) -m idckit.cli reproduce --profile $(PROFILE) $(if $(DATA_ROOT),--data-root $(DATA_ROOT)) $(NOTEBOOKS)

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean-reports:
	rm -rf reports/*.html reports/*.json
