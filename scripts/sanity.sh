#!/usr/bin/env bash
# ansible-test sanity for the gpuaas.fleet collection, plus antsibull-changelog lint.
#
# Needs only PyPI. ansible-test puts pip into each sanity venv with a get-pip script from
# ci-files.testing.ansible.com unless one is cached in ~/.ansible/test/cache; an offline
# stand-in (tests/sanity/get_pip_standin.py) and the pinned pip wheel it installs
# (tests/sanity/requirements.txt) are placed there. The tools of each test (pylint, yamllint,
# voluptuous, ...) are then installed by ansible-test from PyPI with its own pins, into venvs
# cached under ~/.ansible/test/venv.
#
# ansible-test needs the collection at .../ansible_collections/gpuaas/fleet and lists files with
# git, so the files galaxy.yml would ship (tracked and new unignored files minus build_ignore)
# are copied into build/sanity/ansible_collections/gpuaas/fleet, a tree with its own git repo.
#
# Usage: scripts/sanity.sh [ansible-test sanity options and paths], e.g.
#   scripts/sanity.sh --test validate-modules --test pylint plugins/modules/disk_wipe.py
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=$root/.venv
[ -x "$venv/bin/ansible-test" ] || { echo "sanity: $venv is missing; run scripts/setup.sh" >&2; exit 1; }
command -v shellcheck >/dev/null || { echo "sanity: shellcheck is missing; run scripts/setup.sh" >&2; exit 1; }
export PATH="$venv/bin:$PATH"
started=$SECONDS

# Several engineers share this checkout: one run at a time owns build/sanity and the venvs.
mkdir -p "$root/build"
exec 9>"$root/build/sanity.lock"
flock 9

# The get-pip stand-in and its wheel, for the pip version this ansible-test bootstraps.
pip_version=$(python - <<'EOF'
from ansible_test._internal.python_requirements import get_venv_packages


class Python311:
    version = "3.11"


print(get_venv_packages(Python311())["pip"])
EOF
)
requirements=$root/tests/sanity/requirements.txt
if ! grep -q "^pip==${pip_version} " "$requirements"; then
  echo "sanity: ansible-test bootstraps pip ${pip_version}; pin that version and its sha256" \
    "in $requirements" >&2
  exit 1
fi
cache=$HOME/.ansible/test/cache
mkdir -p "$cache"
if [ ! -f "$cache/pip-${pip_version}-py3-none-any.whl" ]; then
  python -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes -r "$requirements" -d "$cache"
fi
install -m 0644 "$root/tests/sanity/get_pip_standin.py" "$cache/get_pip_${pip_version//./_}.py"

# A clean copy of what the collection artifact contains.
collection=$root/build/sanity/ansible_collections/gpuaas/fleet
rm -rf "$root/build/sanity"
mkdir -p "$collection"
python - <<'EOF' | tar -C "$root" --null -T - -cf - | tar -C "$collection" -xf -
import fnmatch
import os
import subprocess
import sys

import yaml

with open("galaxy.yml", encoding="utf-8") as galaxy:
    patterns = yaml.safe_load(galaxy).get("build_ignore", [])


def listed(*options):
    out = subprocess.run(["git", "ls-files", "-z", *options], check=True, capture_output=True)
    return {path for path in out.stdout.decode().split("\0") if path}


def ignored(path):
    # ansible-galaxy matches build_ignore against every directory and file on the way down.
    parts = path.split("/")
    prefixes = ("/".join(parts[: depth + 1]) for depth in range(len(parts)))
    return any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes for pattern in patterns)


paths = listed("--cached", "--others", "--exclude-standard") - listed("--deleted")
for path in sorted(paths):
    if not ignored(path) and os.path.lexists(path):
        sys.stdout.write(path + "\0")
EOF
git -C "$collection" -c init.defaultBranch=main init -q
git -C "$collection" add -A

# ansible-test points Ansible at its own config; keep the repo's out of its environment.
# Both checks always run so one report shows every problem.
sanity_rc=0
(
  cd "$collection"
  unset ANSIBLE_CONFIG ANSIBLE_COLLECTIONS_PATH ANSIBLE_COLLECTIONS_PATHS
  # pslint needs PowerShell and PSScriptAnalyzer, which neither PyPI nor Debian provide; it
  # applies only to .ps1/.psm1 files and this collection manages Linux hosts, so it has none.
  ansible-test sanity --python 3.11 --color no --skip-test pslint "$@"
) || sanity_rc=$?

changelog_rc=0
antsibull-changelog lint || changelog_rc=$?

elapsed=$((SECONDS - started))
if [ "$sanity_rc" -ne 0 ] || [ "$changelog_rc" -ne 0 ]; then
  echo "sanity: FAILED in ${elapsed}s (ansible-test sanity rc=$sanity_rc," \
    "antsibull-changelog lint rc=$changelog_rc)" >&2
  exit 1
fi
echo "sanity: passed in ${elapsed}s"
