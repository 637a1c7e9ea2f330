# Two commands do all the set-up: `make demo` (the main job) and `make test` (the suite).
# Each creates .venv on first use and reinstalls only when requirements.txt or pyproject.toml
# changed since the last install (the stamp file records that install). The suite runs on two
# pytest-xdist workers (CI has 2 cores; the tests' training runs use one thread each).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: demo test setup clean-venv

demo: $(STAMP)
	$(PY) scripts/run_curriculum.py $(ARGS)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 2 $(ARGS)

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

clean-venv:
	rm -rf $(VENV)
