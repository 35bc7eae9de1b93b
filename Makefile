# idckit: every set-up step lives here, so a fresh clone needs only `make reproduce` or `make test`.
# Both are idempotent: the venv is rebuilt only when pyproject.toml changes, finished runs are cached.
# The kit's own names are fixed (`override`): no command line or environment turns them into other shell text.
override SHELL := /bin/bash
override VENV  := .venv
override PY    := $(VENV)/bin/python
override STAMP := $(VENV)/.idckit-installed
PYTHON ?= python3.11
PROFILE ?= cpu
# One root per dataset (idckit/registry.py); unset: that dataset's synthetic set. A notebook gets the roots it reads.
CLEVR_ROOT ?=
SPOT_ROOT ?=
IER_ROOT ?=
BIRDS_ROOT ?=
# The authors' released checkpoints (their file, or a run of `idckit import-checkpoint`), scored as a side row of
# the tables that take them (idckit/registry.py's RELEASED): IDC-PCL tables 2-4, CLIP4IDC tables 1-2 and table 6.
PCL_CKPT ?=
CLIP4IDC_CKPT ?=
CLIP4IDC_ADAPT_CKPT ?=
NOTEBOOKS ?=
# DEVICE: auto (cuda > mps > cpu), cpu, cuda, cuda:N or mps; empty = each config's device (auto).
DEVICE ?=
# NPROC > 1: the runs are trained first by `idckit train` under torchrun (DistributedDataParallel, one process per
# GPU), then the notebooks find them in the run cache and only render the reports. Trained that way: every variant
# of every family (IDC-PCL, DUDA, IDC-PCL on birds, CLIP4IDC) at seed 0 and CLIP4IDC's captioning seeds 1 and 2
# (tables 1-2); the rest (table 7's layer splits, other seeds, the synthetic hard twin) still trains in the
# notebook's one process (docs/real_data.md).
NPROC ?= 1
# JOBS: notebooks `idckit reproduce` runs at once (empty: runtime.json's reproduce_jobs).
JOBS ?=
# TEST_WORKERS: `make test`'s pytest-xdist processes, one torch thread each (tests/conftest.py); 0: one process.
TEST_WORKERS ?= 2
# The GPU check's output folder and interpreter (see gpu-check below).
GPU_CHECK_OUT ?= gpu_check
GPU_CHECK_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
# The GPU study's output folder (issue 52; lab/scripts/gpu_study.py; run with GPU_CHECK_PY's interpreter).
GPU_STUDY_OUT ?= gpu_study

# A value a user sets, on the command line or in the environment, is text: taken as given (never expanded as make
# code, so `$(shell ...)` in it does nothing) and handed to the recipes in their environment, where they read it
# quoted ("$$CLEVR_ROOT"). No value is ever part of the shell text a recipe runs.
override USER_VARIABLES := PYTHON PROFILE CLEVR_ROOT SPOT_ROOT IER_ROOT BIRDS_ROOT PCL_CKPT CLIP4IDC_CKPT \
  CLIP4IDC_ADAPT_CKPT NOTEBOOKS DEVICE NPROC JOBS TEST_WORKERS GPU_CHECK_OUT GPU_CHECK_PY GPU_STUDY_OUT
$(foreach v,$(USER_VARIABLES),$(if $(filter command environment,$(firstword $(origin $(v)))),\
  $(eval override $(v) := $$(value $(v)))))
export $(USER_VARIABLES)
export PYTHONHASHSEED = 0

.PHONY: help setup reproduce test lab bench doctor gpu-check gpu-study clean-reports check-java chromium screenshots

help:
	@echo "make reproduce   set up .venv and run every notebook into reports/ (PROFILE=$$PROFILE; smoke|cpu|paper;"
	@echo "                 DEVICE=auto|cpu|cuda:N; NPROC=N trains on N GPUs with torchrun first;"
	@echo "                 JOBS=N notebooks at once (default: runtime.json's reproduce_jobs);"
	@echo "                 CLEVR_ROOT= SPOT_ROOT= IER_ROOT= BIRDS_ROOT= real datasets (unset: synthetic)"
	@echo "                 PCL_CKPT= CLIP4IDC_CKPT= CLIP4IDC_ADAPT_CKPT= the authors' released checkpoints, scored"
	@echo "                 as a side row of IDC-PCL tables 2-4, CLIP4IDC tables 1-2 and 6 (docs/parity.md)"
	@echo "                 profiles other than cpu write to reports/<profile>/ and leave the README's table alone)"
	@echo "make doctor      devices, bf16, Java, weights and datasets this machine has"
	@echo "make gpu-check   minutes on one GPU: CPU=GPU equality, resume, torchrun, paper-size speed -> gpu_check/"
	@echo "make gpu-study   <= 9 min on one H200: IDC-PCL and CLIP4IDC at 1-30x the cpu budget -> gpu_study/"
	@echo "                 (DEVICE=cpu: the dry run at tiny sizes; lab/scripts/gpu_study.py --score DIR scores it)"
	@echo "make test        set up .venv and run the test suite (TEST_WORKERS=$$TEST_WORKERS processes)"
	@echo "make lab         open JupyterLab with the idckit kernel"
	@echo "make bench       run the benchmarks in bench/"

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "idckit: Java is required (pycocoevalcap's METEOR and PTB tokenizer run on the JVM) but 'java' is not on PATH."; \
	  echo "        fix: sudo apt-get install -y default-jre-headless   (or any Java >= 8 on PATH)"; exit 1; }

$(STAMP): pyproject.toml
	@command -v "$$PYTHON" >/dev/null 2>&1 || { echo "idckit: $$PYTHON not found; install Python 3.11 or pass PYTHON=/path/to/python3.11"; exit 1; }
	test -x $(PY) || "$$PYTHON" -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch/torchvision are pinned in pyproject.toml to the wheels this machine has on disk.
	$(PY) -m pip install --quiet -e .
	# The kernelspec stays inside the venv (never --user) so notebooks run with the kit's own interpreter.
	$(PY) -m ipykernel install --sys-prefix --name idckit --display-name "Python (idckit)" >/dev/null
	touch $(STAMP)

# Headless Chromium renders the reports in tests/test_browser.py and makes the README's screenshot.
# Found the way idckit.reports.browser.find_chromium finds it; installed from Debian (about 45 s, once) only when absent.
chromium:
	@if [ -n "$$IDCKIT_CHROMIUM" ] || command -v chromium chromium-browser google-chrome >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "idckit: installing Debian's chromium for the browser tests (once; log in /tmp/idckit-apt.log)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  (apt-get install -y -q chromium >/tmp/idckit-apt.log 2>&1 || \
	   (apt-get update -q >>/tmp/idckit-apt.log 2>&1 && apt-get install -y -q chromium >>/tmp/idckit-apt.log 2>&1)) \
	  || { echo "idckit: apt-get install chromium failed; see /tmp/idckit-apt.log"; exit 1; }; \
	else echo "idckit: note: no chromium and no root apt-get; tests/test_browser.py will skip (and fail under CI=true)"; \
	  echo "        fix: sudo apt-get install -y chromium   (or set IDCKIT_CHROMIUM=/path/to/chrome)"; fi

setup: check-java chromium $(STAMP)

# Options for the set variables; each value is read from the recipe's environment, quoted.
override ROOT_ARGS = $(if $(CLEVR_ROOT),--clevr-root "$$CLEVR_ROOT") $(if $(SPOT_ROOT),--spot-root "$$SPOT_ROOT") \
  $(if $(IER_ROOT),--ier-root "$$IER_ROOT") $(if $(BIRDS_ROOT),--birds-root "$$BIRDS_ROOT")
override RELEASED_ARGS = $(if $(PCL_CKPT),--released-checkpoint "$$PCL_CKPT") \
  $(if $(CLIP4IDC_CKPT),--released-caption-checkpoint "$$CLIP4IDC_CKPT") \
  $(if $(CLIP4IDC_ADAPT_CKPT),--released-adapt-checkpoint "$$CLIP4IDC_ADAPT_CKPT")
override TRAIN_ARGS = --profile "$$PROFILE" $(ROOT_ARGS) $(if $(DEVICE),--device "$$DEVICE")
# the experiment families of the table manifest (read when a target needs them, after setup)
override FAMILIES = $(shell $(PY) -c "from idckit.registry import FAMILIES; print(*FAMILIES)")

# NOTEBOOKS is a list of names: split at blanks, never globbed (set -f) or run.
reproduce: setup
ifneq ($(NPROC),1)
	for f in $(FAMILIES); do $(VENV)/bin/torchrun --standalone --nproc_per_node="$$NPROC" -m idckit.cli train $$f $(TRAIN_ARGS) || exit 1; done
	$(VENV)/bin/torchrun --standalone --nproc_per_node="$$NPROC" -m idckit.cli train clip4idc $(TRAIN_ARGS) --variants clip4idc --seeds 1 2
endif
	set -f; $(PY) -m idckit.cli reproduce $(TRAIN_ARGS) $(RELEASED_ARGS) $(if $(JOBS),--jobs "$$JOBS") $$NOTEBOOKS

# The tests never reach a model hub; reproduce may (PROFILE=paper fetches ResNet-101 and ViT-B/32 by name).
test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -p no:cacheprovider -n "$$TEST_WORKERS"

doctor: setup
	$(PY) -m idckit.cli doctor --profile "$$PROFILE" $(ROOT_ARGS)

# The GPU check (idckit/cli/gpu_check.py): at most 8 minutes on one GPU, no dataset, no weights, no Java. It imports
# only torch, torchvision, open_clip_torch, numpy, pillow and tqdm, so it needs no `make setup`: it runs with the
# venv's Python when there is one, else with the box's own (GPU_CHECK_PY=...). DEVICE=cpu is the dry mode.
gpu-check:
	"$$GPU_CHECK_PY" -m idckit.cli.gpu_check --out "$$GPU_CHECK_OUT" $(if $(DEVICE),--device "$$DEVICE")

# The GPU study (issue 52, lab/scripts/gpu_study.py): renders, extracts and trains in a work folder outside the clone
# (/tmp/idckit-gpu-study) and writes at most 8 JSON files to GPU_STUDY_OUT. DEVICE=cpu is its dry run.
gpu-study:
	"$$GPU_CHECK_PY" -m lab.scripts.gpu_study --out "$$GPU_STUDY_OUT" $(if $(filter cpu,$(DEVICE)),--dry-run,$(if $(DEVICE),--device "$$DEVICE"))

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# The README's picture of reports/index.html (1280 px wide, as tall as the page) and the first screen (1400 x 900)
# of two reports, whose summary card a reader sees before any scrolling; in headless Chromium.
override SCREENSHOT_REPORTS := table2_clevr_change clip4idc_table1_clevr_change
screenshots: setup
	$(PY) -c "from idckit.reports.browser import screenshot; screenshot('reports/index.html', 'docs/img/index.png', width=1280, full_page=True)"
	for r in $(SCREENSHOT_REPORTS); do $(PY) -c "from idckit.reports.browser import screenshot; screenshot('reports/$$r.html', 'docs/img/$$r.png', width=1400, height=900)" || exit 1; done

clean-reports:
	rm -rf reports/*.html reports/*.json
