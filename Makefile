# bootprof: two commands set up a fresh machine.
#   make pipeline [TRACE=path/to/trace.etl]   install, then run jobs/demo.yaml (demo trace without TRACE)
#   make test                                 install, then the whole test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JOB    ?= jobs/demo.yaml
RUN    ?=

.PHONY: install system-deps pipeline test bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

# Debian packages the tests drive for real (headless Chromium for the HTML report, clang-cl and
# lld-link to build PE+PDB test images, cabextract for LZX-compressed .pd_ files). Installed only when missing.
system-deps:
	@bash scripts/system-deps.sh

pipeline: install
	$(PY) -m pipeline run $(JOB) $(if $(TRACE),--trace $(TRACE)) $(if $(RUN),--run $(RUN))

test: install system-deps
	$(PY) -m pytest

bench: install
	$(PY) bench/run.py

clean:
	rm -rf runs demo bench/out .pytest_cache
