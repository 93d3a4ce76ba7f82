#!/usr/bin/env bash
# Prepares a fresh Debian 12 machine for the demo and the tests: system packages,
# a Python 3.11 virtual environment with pinned dependencies, and the collection
# made resolvable as gpuaas.fleet without Ansible Galaxy. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv="$root/.venv"

missing_packages() {
  local pkg
  while read -r pkg; do
    [ -z "$pkg" ] && continue
    dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q '^install ok installed$' || echo "$pkg"
  done < <(sed -e 's/#.*//' -e '/^\s*$/d' scripts/system-packages.txt)
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

stamp="$venv/.gpuaas-setup"
want=$(cat requirements.lock pyproject.toml lab/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  [ -x "$venv/bin/python" ] || "$python_bin" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements.lock
  # The project and the lab package (demo, labs, synthetic fleets: development only, not
  # product code), editable. setuptools explains editable installs at length on every
  # build: its output is shown only if the install fails.
  for project in . lab; do
    if ! log=$("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
        -e "$project" 2>&1); then
      echo "$log" >&2
      exit 1
    fi
  done
  echo "$want" > "$stamp"
fi

# The collection is this repository: expose it as ansible_collections/gpuaas/fleet.
mkdir -p "$root/.collections/ansible_collections/gpuaas"
ln -sfn "$root" "$root/.collections/ansible_collections/gpuaas/fleet"
