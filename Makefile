# Omni-Decision pipeline. Every target installs what it needs on first use (.venv + a stamp file).
SHELL := /bin/bash
PY_BOOT ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYTHONPATH := $(CURDIR)
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup test test-all lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints/cpu.txt
	@command -v $(PY_BOOT) >/dev/null || { echo "error: $(PY_BOOT) not found (Python 3.11 is required)"; exit 1; }
	test -x $(PY) || $(PY_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints/cpu.txt -e ".[test]"
	@touch $(STAMP)

test: $(STAMP)  ## fast CPU suite (gpu/vllm deselected)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
