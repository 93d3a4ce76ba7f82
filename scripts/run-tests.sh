#!/usr/bin/env bash
# Every test the project has: unit and integration tests (real PostgreSQL, loop devices,
# namespaces, libvirt/QEMU), ansible-test sanity, and Molecule scenarios.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$PWD/ansible.cfg"

pytest -n "${GPUAAS_TEST_WORKERS:-2}" --dist loadgroup tests
scripts/sanity.sh
scripts/molecule.sh
