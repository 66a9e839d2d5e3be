# Two commands for a fresh machine: `make run` (the local network) and `make test`.
# Both install what they need first; the install is skipped when it is up to date.
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: run test test-fast install bench simulate clean

run: $(VENV)/.installed
	$(PY) scripts/localnet.py $(ARGS)

# every tier (tests/conftest.py says what each holds): unit and integration spread over one process per core
# (a module stays in one process: its fixtures are built once; the modules are handed out in the order given,
# the slow integration files first and the many short unit files last, so the processes finish together),
# then the e2e networks, two at a time (they wait on the real clock for most of their windows: one network
# keeps the 2 cores about 45 % busy); with ARGS, one plain pytest run of what they select
test: $(VENV)/.installed
ifeq ($(strip $(ARGS)),)
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder tests/integration tests/unit
	$(PY) -m pytest -q -n 2 --dist loadfile tests/e2e
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
