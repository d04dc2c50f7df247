# make test    - install everything (tarantool server, .venv, the package) and run the tests
# make bench   - run the load generator against a throwaway local server
# make bench SHARDS=N [DRIVER=vshard|router|router-threads] - over N replica sets and a Lua
#                router (TARANTOOL= a 2.11+ build; HOST=router PORT=p: an existing cluster)
# make compare - sync, threads, gtarantool and asynctnt side by side (RATE=R: at one fixed rate)
# make capacity SLO=p99=2ms - the highest fixed rate that meets a latency SLO (DRIVER=asynctnt ...)
# make perf    - the speed targets (ratios against asynctnt and the sync client)
# make instructions - instructions per request under callgrind, host-independent
# make sweep   - gtarantool vs asynctnt (and sync) at 1 to 10,000 greenlets, with its targets
# make profile - greenlet-aware yappi profiles for kcachegrind
# make soak    - long mixed load with injected faults (not part of CI)
# make chaos   - seeded fault schedules, every call's outcome checked against the servers:
#                SEEDS=N (default 5), SEED=n replays one, DURATION=s per seed (default 6)
# make locust  - bench/locust/locustfile.py under Locust, headless, counts checked against box.stat
# make locust-master WORKERS=N / make locust-worker MASTER=host - the same over several machines
# make sanitize - the C paths' tests and fuzzers under ASan+UBSan (FUZZ_SECONDS, FUZZ_SEED)
# make fuzz    - the fuzzers on the normal build: make fuzz SECONDS=600 SEED=2
# make copy-demo - a generated 1M-row CSV file imported into a throwaway server (ROWS=, PROCS=)
# make copy-bench - bulk import rows per client CPU-second against a raw socket (python -m bench.copy)
# make docs    - the Sphinx manual in docs/_build/html (warnings are errors)
# make lint    - ruff over the repo, mypy over the package
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
STAMP := $(VENV)/.installed

PROCS ?= $(or $(INSTANCES),1)
GREENLETS ?= 100
OPS ?= 100000
SIZE ?=
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
USERS ?= 200
WORKERS ?= 1
MASTER ?= 127.0.0.1
LOCUST_OUT ?= locust-report
# make locust's server: HOST=host:port (default: a throwaway local one)
# make locust runs 2 processes unless PROCS is given
LOCUST_ARGS = -u $(USERS) -p $(if $(filter command line environment,$(origin PROCS)),$(PROCS),2) \
	-t $(or $(DURATION),30s) --out $(LOCUST_OUT) $(if $(HOST),--host $(HOST)$(if $(PORT),:$(PORT)))
LOCUSTFILE_ARGS = -f bench/locust/locustfile.py --bench-prepare \
	$(if $(HOST),--host tarantool://$(HOST)$(if $(PORT),:$(PORT)))
POOL ?=
HOSTS ?=
INSTANCES ?=
# Open loop and workloads over loaded records (docs/loadgen.rst)
RATE ?=
ARRIVALS ?=
RECORDS ?=
DISTRIBUTION ?=
MIX ?=
SLO ?= p99=2ms
SHARDS ?=

BENCH_ARGS = --procs $(PROCS) --greenlets $(GREENLETS) --ops $(OPS) $(if $(SIZE),--size $(SIZE)) \
	--workload $(WORKLOAD) $(if $(DURATION),--duration $(DURATION)) $(if $(JSON),--json $(JSON)) \
	$(if $(WAL),--wal $(WAL)) $(if $(PLOT),--plot $(PLOT)) \
	$(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT)) \
	$(if $(POOL),--pool) $(if $(HOSTS),--hosts $(HOSTS)) $(if $(INSTANCES),--instances $(INSTANCES)) \
	$(if $(RATE),--rate $(RATE)) $(if $(ARRIVALS),--arrivals $(ARRIVALS)) \
	$(if $(RECORDS),--records $(RECORDS)) $(if $(DISTRIBUTION),--distribution $(DISTRIBUTION)) \
	$(if $(MIX),--mix $(MIX))
# make capacity: a mix over loaded records unless WORKLOAD is given
CAPACITY_ARGS = $(filter-out --workload $(WORKLOAD),$(BENCH_ARGS)) \
	--workload $(if $(filter command line environment,$(origin WORKLOAD)),$(WORKLOAD),mix)
# HLOG=run.hlog: the latencies as an HdrHistogram interval log
HLOG ?=
BENCH_ARGS += $(if $(HLOG),--hlog $(HLOG))

.PHONY: all install server test test-python bench compare capacity perf sweep instructions profile soak chaos \
	locust copy-demo copy-bench \
	locust-master locust-worker sanitize fuzz docs lint clean

all: test

# TARANTOOL=/path/to/tarantool: every target starts that server binary instead
# (a build of 2.11 or 3.x gets the shared libraries it needs installed).
TARANTOOL_RUNTIME := libicu72 libreadline8 libssl3 libunwind8 libgomp1

server:
ifeq ($(TARANTOOL),)
	@command -v tarantool >/dev/null 2>&1 || { $(SUDO) apt-get update && \
		$(SUDO) apt-get install -y tarantool; }
else
	@"$(TARANTOOL)" --version >/dev/null 2>&1 || { $(SUDO) apt-get update && \
		$(SUDO) apt-get install -y --no-install-recommends $(TARANTOOL_RUNTIME); }
	@"$(TARANTOOL)" --version | head -n 1
endif

$(STAMP): setup.py pyproject.toml gtarantool/_speedups.c gtarantool/_encoder.c gtarantool/_pool.c
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

# tests/: the library's; bench/tests/: the load generator's
# PYTEST_ARGS: more pytest arguments, e.g. PYTEST_ARGS='-m "not packaging"'
# TEST_JOBS: test processes (pytest-xdist), each taking whole files (a file's
# servers and clusters start once); most tests wait on servers and timers, so
# three share two cores well.  TEST_JOBS=0 runs the suite in this process.
TEST_JOBS ?= 3
XDIST = -n $(TEST_JOBS) --dist loadfile
test: install
	$(PY) -m pytest -q $(XDIST) tests bench/tests $(PYTEST_ARGS)

# the suite with every compiled path switched off, as a build without a compiler runs
test-python: install
	GTARANTOOL_PURE_PYTHON=1 $(PY) -m pytest -q $(XDIST) tests -m "not packaging" $(PYTEST_ARGS)

bench: install
	$(PY) -m bench $(BENCH_ARGS) --driver $(DRIVER) $(if $(SHARDS),--shards $(SHARDS))

compare: install
	$(PY) -m bench.compare $(BENCH_ARGS) $(if $(DRIVERS),--drivers $(DRIVERS))

capacity: install
	$(PY) -m bench.capacity $(CAPACITY_ARGS) $(if $(DRIVERS),--drivers $(DRIVERS),--driver $(DRIVER)) --slo $(SLO)

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

# (SEED below is also the fuzzers' default: here only a SEED given to make counts)
chaos: install
	$(PY) -m gtarantool.testing.chaos --duration $(or $(DURATION),6) \
		$(if $(filter command line environment,$(origin SEED)),--seed $(SEED),--seeds $(or $(SEEDS),5))

locust: install
	$(PY) -m bench.locust_run $(LOCUST_ARGS)

# Several machines: the master (web UI on :8089 unless DURATION is given: then headless)
# waits for WORKERS worker processes in all; each worker machine runs
# make locust-worker MASTER=host PROCS=N.
locust-master: install
	$(PY) -m locust $(LOCUSTFILE_ARGS) --master --expect-workers $(WORKERS) \
		$(if $(DURATION),--headless -u $(USERS) -r $(USERS) -t $(DURATION) --stop-timeout 10 \
		--csv $(LOCUST_OUT)/locust --html $(LOCUST_OUT)/locust.html --json-file $(LOCUST_OUT)/locust)

locust-worker: install
	$(PY) -m locust -f bench/locust/locustfile.py --worker --master-host $(MASTER) \
		$(if $(filter command line environment,$(origin PROCS)),--processes $(PROCS))
sanitize: install
	PY=$(PY) tests/sanitize.sh

SECONDS ?= 60
SEED ?= 1
fuzz: install
	$(PY) -m tests.fuzz --seconds $(SECONDS) --seed $(SEED)

# autodoc imports gtarantool: the venv with the package and the docs extra; dot draws the diagrams
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[docs]'
	touch $@

docs: install $(DOCS_STAMP)
	@command -v dot >/dev/null 2>&1 || { $(SUDO) apt-get update && $(SUDO) apt-get install -y graphviz; }
	@# gevent patches ssl before Sphinx imports it: gtarantool.locust imports locust, which patches
	$(PY) -c "from gevent import monkey; monkey.patch_all(); import sys; \
		from sphinx.cmd.build import main; sys.exit(main(sys.argv[1:]))" \
		-W --keep-going -b html docs docs/_build/html
	@echo "the manual: docs/_build/html/index.html"

# ruff (pyflakes, pycodestyle, import order) over the repo, mypy over the package
LINT_STAMP := $(VENV)/.lint-installed
$(LINT_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[lint]'
	touch $@

lint: install $(LINT_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache profiles $(LOCUST_OUT) docs/_build

# make copy-demo - a generated 1M-row file imported into a throwaway server (ROWS=, PROCS=)
# make copy-bench - copy_from and the CLI against a raw pipelined socket
copy-demo: install
	$(PY) -m bench.copy --demo $(or $(ROWS),1000000) $(if $(filter command line,$(origin PROCS)),--demo-procs $(PROCS))

copy-bench: install
	$(PY) -m bench.copy --runs $(RUNS)
