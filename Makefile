# Two commands for a fresh machine: `make run` (the local network) and `make test`.
# Both install what they need first; the install is skipped when it is up to date.
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: run test test-fast install bench simulate clean

run: $(VENV)/.installed
	$(PY) scripts/localnet.py $(ARGS)

# every tier: unit, integration, e2e (tests/conftest.py says what each holds)
test: $(VENV)/.installed
	$(PY) -m pytest -q $(ARGS)

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
