# Two entry points for a new user: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: setup setup-demo demo test test-lab lint sanity maas-script artifacts bench clean

# Set-up in two layers (scripts/setup.sh): what the demo needs, and the tests' tools on top.
setup:
	@scripts/setup.sh test

setup-demo:
	@scripts/setup.sh demo

demo: setup-demo
	gpuaas demo

# The two test tiers (docs/testing.md, "Test tiers"): what every change passes, and the lab proofs.
test: setup
	scripts/run-tests.sh test

test-lab: setup
	scripts/run-tests.sh lab

sanity: setup
	scripts/sanity.sh

maas-script: setup
	python scripts/maas/build_commissioning_script.py

# The release artifacts a controller is installed from (docs/operations.md), in build/artifacts.
artifacts: setup
	scripts/build-artifacts.sh build/artifacts

lint: setup
	scripts/lint.sh

bench: setup
	@for b in bench/*.py; do echo "== $$b"; python $$b || exit 1; done

clean:
	rm -rf $(VENV) .collections .pytest_cache build
