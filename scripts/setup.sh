#!/usr/bin/env bash
# Prepares a fresh Debian 12 machine in two layers: `demo` (what `make demo` needs: system
# packages, a Python 3.11 virtual environment with pinned dependencies, the collection made
# resolvable as gpuaas.fleet without Ansible Galaxy) and `test` (the demo layer, then what
# the tests need on top). Safe to run repeatedly; each layer is redone only when its inputs
# change.
#   scripts/setup.sh [demo|test]      (default: test)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv="$root/.venv"
layer=${1:-test}
case "$layer" in
  demo) package_lists=(scripts/system-packages.txt) ;;
  test) package_lists=(scripts/system-packages.txt scripts/system-packages-test.txt) ;;
  *) echo "usage: scripts/setup.sh [demo|test]" >&2; exit 2 ;;
esac

missing_packages() {
  local pkg
  while read -r pkg; do
    [ -z "$pkg" ] && continue
    dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q '^install ok installed$' || echo "$pkg"
  done < <(sed -e 's/#.*//' -e '/^\s*$/d' "${package_lists[@]}")
}

mapfile -t missing < <(missing_packages)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python_bin=${GPUAAS_PYTHON:-}
if [ -z "$python_bin" ]; then
  for candidate in /usr/bin/python3.11 python3.11 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      python_bin=$candidate; break
    fi
  done
fi
[ -n "$python_bin" ] || { echo "setup: Python 3.11 is required" >&2; exit 1; }

pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
# Each lock constrains the other: whatever one layer pulls in is pinned where the other
# pins it, so the test layer installs on top of the demo layer without moving it.
demo_stamp="$venv/.gpuaas-setup"
demo_want=$(cat requirements.lock pyproject.toml lab/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$demo_stamp" ] || [ "$(cat "$demo_stamp")" != "$demo_want" ]; then
  [ -x "$venv/bin/python" ] || "$python_bin" -m venv "$venv"
  "${pip[@]}" --upgrade pip
  "${pip[@]}" -r requirements.lock -c requirements-test.lock
  # The project and the lab package (demo, labs, synthetic fleets: development only, not
  # product code), editable. setuptools explains editable installs at length on every
  # build: its output is shown only if the install fails.
  for project in . lab; do
    if ! log=$("${pip[@]}" --no-deps -e "$project" 2>&1); then
      echo "$log" >&2
      exit 1
    fi
  done
  echo "$demo_want" > "$demo_stamp"
fi

# The test layer's stamp covers the demo layer's inputs too: a demo layer redone for new
# pins redoes the test layer on its next run.
test_stamp="$venv/.gpuaas-setup-test"
test_want=$(printf '%s\n' "$demo_want" | cat - requirements-test.lock | sha256sum | cut -d' ' -f1)
if [ "$layer" = test ] && { [ ! -f "$test_stamp" ] || [ "$(cat "$test_stamp")" != "$test_want" ]; }; then
  "${pip[@]}" -r requirements-test.lock -c requirements.lock
  echo "$test_want" > "$test_stamp"
fi

# The collection is this repository: expose it as ansible_collections/gpuaas/fleet.
mkdir -p "$root/.collections/ansible_collections/gpuaas"
ln -sfn "$root" "$root/.collections/ansible_collections/gpuaas/fleet"
