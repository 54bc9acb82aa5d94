# bootprof: two commands set up a fresh machine.
#   make pipeline [TRACE=path/to/trace.etl]   install, then run jobs/single-trace.yaml (demo trace without TRACE)
#   make test                                 install, then the whole test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JOB    ?= jobs/single-trace.yaml
RUN    ?=

FUZZ_BUDGET ?= 1800
FUZZ_SEED   ?= 0

.PHONY: install system-deps pipeline test bench fuzz clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	$(PY) scripts/compile_kernels.py
	@touch $(STAMP)

install: $(STAMP)

# Debian packages the tests drive for real (headless Chromium for the HTML report, clang-cl and
# lld-link to build PE+PDB test images, cabextract for LZX-compressed .pd_ files, npm for speedscope, perf to record
# real builds, and Rust crates of Debian's registry for those builds to depend on). Installed only when missing.
system-deps:
	@bash scripts/system-deps.sh

pipeline: install
	$(PY) -m pipeline run $(JOB) $(if $(TRACE),--trace $(TRACE),$(if $(RUN),,--demo)) $(if $(RUN),--run $(RUN)) $(if $(SYMBOL_PATH),--symbol-path '$(SYMBOL_PATH)')

# The newest DuckDB 1.x, beside the project's own DuckDB: the tests open the warehouse with it (a file that
# DuckDB 1.x cannot read is no use to a CI that has its CLI). Installed once, into .venv/duckdb1.
DUCKDB1 := $(VENV)/duckdb1/.installed

$(DUCKDB1): | $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check --target $(VENV)/duckdb1 'duckdb>=1.5,<2'
	@touch $(DUCKDB1)

# speedscope from npm (pinned), the consumer the report's exports are loaded into in headless Chromium
# (tests/test_report_etl.py, tests/test_report_queries.py). Installed once, into .venv/speedscope.
SPEEDSCOPE_VERSION := 1.25.0
SPEEDSCOPE := $(VENV)/speedscope/.installed

$(SPEEDSCOPE): | $(STAMP) system-deps
	npm install --silent --no-audit --no-fund --prefix $(VENV)/speedscope speedscope@$(SPEEDSCOPE_VERSION)
	@touch $(SPEEDSCOPE)

# pyright from npm (pinned): its models of Windows and macOS check that the package calls no API a system
# lacks (tests/test_portable.py). Installed once, into .venv/pyright.
PYRIGHT_VERSION := 1.1.409
PYRIGHT := $(VENV)/pyright/.installed

$(PYRIGHT): | $(STAMP) system-deps
	npm install --silent --no-audit --no-fund --prefix $(VENV)/pyright pyright@$(PYRIGHT_VERSION)
	@touch $(PYRIGHT)

# The suite in TEST_WORKERS processes (pytest-xdist), each test module whole in one of them, the longest handed out
# first (tests/conftest.py's order: xdist's own reorder, by number of tests, is off); TEST_WORKERS=0: in this one
# process.
TEST_WORKERS ?= 2

test: install system-deps $(DUCKDB1) $(SPEEDSCOPE) $(PYRIGHT)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

bench: install
	$(PY) bench/run.py

# Damage the fixtures and small synthesized traces in reproducible ways for FUZZ_BUDGET seconds (not part of
# make test, which runs a short smoke of it): any traceback, or records lost with no error, fails. Then a CI
# runner's faults at random moments (two jobs on one run, signals, inputs replaced, a damaged warehouse) for
# FUZZ_FAULTS_BUDGET seconds: any traceback, hang, process left behind or wrong end state fails.
FUZZ_FAULTS_BUDGET ?= 900
fuzz: install
	$(PY) scripts/fuzz.py --mutations 100000 --seed $(FUZZ_SEED) --budget $(FUZZ_BUDGET)
	$(PY) scripts/fuzz_faults.py --seed $(FUZZ_SEED) --budget $(FUZZ_FAULTS_BUDGET)

clean:
	rm -rf runs demo bench/out .pytest_cache
