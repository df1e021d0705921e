# Two commands: `make test` (the suite CI runs) and `make run` (the main job on the built-in default model).
# Both create .venv when it is missing and install torch pinned first: an unpinned torch pulls a multi-GB CUDA build.
# `make run` installs only the project; `make test` adds the test extra (pytest, transformers, triton) on top.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TESTED := $(VENV)/.installed-test

.PHONY: test run clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e .
	touch $(STAMP)

$(TESTED): $(STAMP)
	$(PY) -m pip install -q -e '.[test]'
	touch $(TESTED)

test: $(TESTED)
	$(PY) -m pytest -q -ra tests

run: $(STAMP)
	$(PY) -m gdn_trt.app.main

clean:
	rm -rf $(VENV) artifacts
