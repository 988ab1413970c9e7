# Two commands on a fresh machine:  make up  |  make test
.PHONY: up test lint check-wheel install install-test test-fast bench clean

VENV := .venv
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

up: $(STAMP)                 ## install, convert the default model (once), start Redis + API + workers + Flower
	$(VENV)/bin/tailguard up

test: $(TEST_STAMP)          ## install, lint, check the wheel, run the whole suite (pure, integration, end-to-end)
	$(VENV)/bin/ruff check .
	PYTHON=$(VENV)/bin/python scripts/check-wheel.sh
	PYTHON=$(VENV)/bin/python scripts/run-tests.sh

lint: $(TEST_STAMP)          ## ruff, as configured in pyproject.toml
	$(VENV)/bin/ruff check .

check-wheel: $(TEST_STAMP)   ## build the wheel, install it in a clean venv, run the installed CLI
	PYTHON=$(VENV)/bin/python scripts/check-wheel.sh

test-fast: $(TEST_STAMP)     ## pure tests only
	$(VENV)/bin/python -m pytest -m "not integration and not fuzz and not e2e and not faults and not multihost"

bench: $(TEST_STAMP)         ## short-request tail latency: tailguard (lanes) vs the fleet users deploy (a tuned vllm serve per engine behind vllm-router, both policies) vs one tuned vLLM on all cores, real engines, small demo model; BENCH_ARGS=... to change
	$(VENV)/bin/tailguard bench $(BENCH_ARGS)

install: $(STAMP)
install-test: $(TEST_STAMP)

$(STAMP): pyproject.toml scripts/install.sh
	scripts/install.sh
	touch $@

$(TEST_STAMP): pyproject.toml scripts/install.sh
	scripts/install.sh test
	touch $@ $(STAMP)

clean:
	rm -rf $(VENV) .tailguard .pytest_cache
