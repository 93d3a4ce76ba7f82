# Two entry points for a new user: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: setup demo test lint unit integration sanity molecule bench clean

setup:
	@scripts/setup.sh

demo: setup
	gpuaas demo

test: setup lint
	scripts/run-tests.sh

sanity: setup
	scripts/sanity.sh

lint: setup
	ruff check .
	ruff format --check .

bench: setup
	@for b in bench/*.py; do echo "== $$b"; python $$b || exit 1; done

clean:
	rm -rf $(VENV) .collections .pytest_cache build
