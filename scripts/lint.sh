#!/usr/bin/env bash
# make lint: ruff (check and format), the built MAAS commissioning script up to date, and
# ansible-lint (production profile, .ansible-lint). The changelog fragments are linted by
# scripts/sanity.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
ruff check .
ruff format --check .
python scripts/maas/build_commissioning_script.py --check
ansible-lint -q
