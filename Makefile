# Two commands for a fresh machine: `make run` (the local network) and `make test`.
# Both install what they need first; the install is skipped when it is up to date.
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: run test install bench simulate clean

run: $(VENV)/.installed
	$(PY) scripts/localnet.py $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -q $(ARGS)

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/bootstrap.sh
	VENV=$(VENV) scripts/bootstrap.sh

bench: $(VENV)/.installed
	$(PY) scripts/bench.py $(ARGS)

simulate: $(VENV)/.installed
	$(PY) scripts/simulate.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
