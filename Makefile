# Two commands for a fresh machine: `make run` (the local network) and `make test`.
# Both install what they need first; the install is skipped when it is up to date.
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: run test test-fast install bench simulate clean

# keep compiled bytecode (some machines set PYTHONDONTWRITEBYTECODE): without it every pytest process rewrites
# the test modules' asserts afresh (about 6 CPU s each) and every node and server compiles the project again
unexport PYTHONDONTWRITEBYTECODE

run: $(VENV)/.installed
	$(PY) scripts/localnet.py $(ARGS)

# every tier (tests/conftest.py says what each holds) in one pytest run over two processes per core
# (docs/decisions/0037-one-run-two-workers-per-core.md): the e2e networks wait on the real clock for most of
# their windows, so the unit and integration files fill the cores beside them; a module stays in one process
# (its fixtures are built once), and the modules are handed out in the order given: the networks first, then
# the slow integration files, then the many short unit files, so the processes finish together; with ARGS,
# one plain pytest run of what they select (nproc without OMP_NUM_THREADS, which GNU nproc obeys)
TEST_WORKERS ?= $(shell echo $$(( 2 * $$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1) )))
test: $(VENV)/.installed
ifeq ($(strip $(ARGS)),)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests/e2e tests/integration tests/unit
else
	$(PY) -m pytest -q $(ARGS)
endif

# the unit tier alone (about a minute on 2 cores): run it after every change
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m unit tests/unit $(ARGS)

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/bootstrap.sh
	VENV=$(VENV) scripts/bootstrap.sh

bench: $(VENV)/.installed
	$(PY) scripts/bench.py $(ARGS)

simulate: $(VENV)/.installed
	$(PY) scripts/simulate.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
