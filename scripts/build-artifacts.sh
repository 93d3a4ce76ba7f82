#!/usr/bin/env bash
# The release artifacts a controller is installed from (docs/operations.md, "Adding a
# controller from the release artifacts"), into DIR (default build/artifacts):
#
#   gpuaas_fleet-VERSION-py3-none-any.whl   controlplane, flows and the gpuaas command
#   requirements.lock                       the pinned requirements it is installed with
#   gpuaas-fleet-VERSION.tar.gz             the collection gpuaas.fleet (galaxy.yml)
#   SHA256SUMS                              their digests
#
# The wheel is built from a copy of its sources, so the checkout gets no build/ or
# egg-info; both builds use this checkout's .venv and nothing from the network.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=$(realpath -m "${1:-build/artifacts}")
venv_bin=$root/.venv/bin

mkdir -p "$out"
rm -f "$out"/gpuaas_fleet-*.whl "$out"/gpuaas-fleet-*.tar.gz "$out/requirements.lock" "$out/SHA256SUMS"
sources=$(mktemp -d)
trap 'rm -rf "$sources"' EXIT
cp -r pyproject.toml README.md COPYING controlplane flows gpuaas_cli "$sources"
find "$sources" -name __pycache__ -prune -exec rm -rf {} +

# setuptools explains its build at length: its output is shown only if the build fails.
if ! log=$("$venv_bin/python" -m pip wheel -q --no-deps --no-build-isolation \
    --wheel-dir "$out" "$sources" 2>&1); then
  echo "$log" >&2
  exit 1
fi
cp requirements.lock "$out/"
"$venv_bin/ansible-galaxy" collection build --force --output-path "$out" "$root" >/dev/null
(cd "$out" && sha256sum gpuaas_fleet-*.whl requirements.lock gpuaas-fleet-*.tar.gz >SHA256SUMS)
ls -1 "$out"
