# Two commands: `make test` (the suite CI runs) and `make run` (the main job on the built-in default model).
# Both create .venv when it is missing and install torch pinned first: an unpinned torch pulls a multi-GB CUDA build.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test run clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -ra tests

run: $(STAMP)
	$(PY) -m gdn_trt.app.main

clean:
	rm -rf $(VENV) artifacts
