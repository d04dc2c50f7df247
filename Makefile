# make test    - install everything (tarantool server, .venv, the package) and run the tests
# make bench   - run the load generator against a throwaway local server
# make compare - sync, threads, gtarantool and asynctnt side by side
# make perf    - the speed targets (ratios against asynctnt and the sync client)
# make instructions - instructions per request under callgrind, host-independent
# make sweep   - gtarantool vs asynctnt (and sync) at 1 to 10,000 greenlets, with its targets
# make profile - greenlet-aware yappi profiles for kcachegrind
# make soak    - long mixed load with injected faults (not part of CI)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
STAMP := $(VENV)/.installed

PROCS ?= 1
GREENLETS ?= 100
OPS ?= 100000
SIZE ?= 1536
WORKLOAD ?= phases
DRIVER ?= gtarantool
DURATION ?=
JSON ?=
PROFILE_DIR ?= profiles
RUNS ?= 5
WAL ?=
PLOT ?=
HOST ?=
PORT ?=
DRIVERS ?=

BENCH_ARGS = --procs $(PROCS) --greenlets $(GREENLETS) --ops $(OPS) --size $(SIZE) \
	--workload $(WORKLOAD) $(if $(DURATION),--duration $(DURATION)) $(if $(JSON),--json $(JSON)) \
	$(if $(WAL),--wal $(WAL)) $(if $(PLOT),--plot $(PLOT)) \
	$(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT))

.PHONY: all install server test bench compare perf sweep instructions profile soak clean

all: test

# TARANTOOL=/path/to/tarantool: every target starts that server binary instead.
server:
	@[ -n "$(TARANTOOL)" ] || command -v tarantool >/dev/null 2>&1 || { $(SUDO) apt-get update && \
		$(SUDO) apt-get install -y tarantool; }

$(STAMP): setup.py pyproject.toml gtarantool/_speedups.c gtarantool/_encoder.c
	$(PYTHON) -m venv $(VENV) || { $(SUDO) apt-get update && \
		$(SUDO) apt-get install -y python3-venv && $(PYTHON) -m venv $(VENV); }
	@# a C compiler and Python's headers build gtarantool/_speedups.c and _encoder.c, which the tests require
	@command -v cc >/dev/null 2>&1 || { $(SUDO) apt-get update && $(SUDO) apt-get install -y gcc; }
	@$(PY) -c "import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(\
		sysconfig.get_paths()['include'], 'Python.h')))" || { $(SUDO) apt-get update && \
		$(SUDO) apt-get install -y python3-dev; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench,profile]'
	touch $@

install: server $(STAMP)
	@command -v callgrind_annotate >/dev/null 2>&1 || { $(SUDO) apt-get update && \
		$(SUDO) apt-get install -y valgrind; }

test: install
	$(PY) -m pytest -q tests

bench: install
	$(PY) -m bench $(BENCH_ARGS) --driver $(DRIVER)

compare: install
	$(PY) -m bench.compare $(BENCH_ARGS) $(if $(DRIVERS),--drivers $(DRIVERS))

perf: install
	$(PY) -m bench.perf --runs $(RUNS) $(if $(WAL),--wal $(WAL)) $(if $(JSON),--json $(JSON))

# OPS=, when given, is the requests per phase and run (the sweep's own default is smaller)
sweep: install
	$(PY) -m bench.sweep --runs $(RUNS) $(if $(WAL),--wal $(WAL)) $(if $(JSON),--json $(JSON)) \
		$(if $(filter command line,$(origin OPS)),--ops $(OPS))

instructions: install
	$(PY) -m bench.instructions $(if $(DRIVERS),--drivers $(DRIVERS)) \
		$(if $(filter command line,$(origin GREENLETS)),--greenlets $(GREENLETS))

profile: install
	$(PY) -m bench $(BENCH_ARGS) --driver $(DRIVER) --profile $(PROFILE_DIR)

soak: install
	$(PY) -m bench.soak --duration $(or $(DURATION),300)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache profiles
