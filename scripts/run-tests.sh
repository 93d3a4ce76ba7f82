#!/usr/bin/env bash
# The tests CI runs: unit and integration tests (real PostgreSQL, loop devices, namespaces,
# libvirt/QEMU), ansible-test sanity, and the Molecule scenarios (all but lab_host, which
# runs by name: scripts/molecule.sh).
#
# The lab-host tests (Debian hosts under QEMU, tests/integration/hostlab) run after the rest,
# side by side with Molecule's scenarios one at a time: at most three TCG guests then share
# the machine, which slow down far more than in proportion when its cores are oversubscribed
# (docs/slice-host.md, "Lab hosts under load").
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$PWD/ansible.cfg"

phase() { echo "== $1 (at $((SECONDS / 60)) min)"; }

phase "unit and integration tests"
pytest -n "${GPUAAS_TEST_WORKERS:-2}" --dist loadgroup --ignore=tests/integration/hostlab tests
phase "ansible-test sanity"
scripts/sanity.sh
phase "lab-host tests and Molecule"
GPUAAS_MOLECULE_WORKERS=${GPUAAS_MOLECULE_WORKERS:-1} scripts/molecule.sh &
molecule=$!
lab=0
pytest tests/integration/hostlab || lab=$?
scenarios=0
wait "$molecule" || scenarios=$?
phase "done: lab-host tests rc=$lab, Molecule rc=$scenarios"
[ "$lab" -eq 0 ] && [ "$scenarios" -eq 0 ]
