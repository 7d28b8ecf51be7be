# The two commands of the README's quick start: `make demo` and `make test`.
# Each creates .venv (python3 -m venv) when missing and installs what it needs.

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# Stamp files so pip runs only when pyproject.toml changes.
STAMP_CORE = $(VENV)/.medrt-core
STAMP_DEV  = $(VENV)/.medrt-dev

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_CORE): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

# The tests also exercise training and MONAI-bundle import, so they need the
# train extra. torch goes first, pinned: 2.13.0 is the CPU build this machine
# keeps on disk; asking for plain torch (or monai first) pulls a multi-GB CUDA build.
# PyPI's Linux torch is that CUDA build too, so on a fresh machine name the CPU index:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,train,gui,ray]'
	touch $@ $(STAMP_CORE)

demo: $(STAMP_CORE)
	$(BIN)/medrt batch sample_dicom --out demo_out

test: $(STAMP_DEV)
	$(BIN)/python -m pytest

lint: $(STAMP_DEV)
	$(BIN)/ruff check medrt tests models gui

bench: $(STAMP_CORE)
	$(BIN)/medrt bench

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
