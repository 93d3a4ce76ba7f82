#!/usr/bin/env bash
# Every role's Molecule scenario (molecule/*/): syntax, check, converge, idempotence, verify
# against isolated targets built on this machine (network + mount namespaces, loop disks,
# the VM lab; see molecule/shared/target.py) and, for lab_host, a Debian host under QEMU
# booted by `gpuaas lab host up`. Needs root; without it, says why and skips.
#
# Usage: scripts/molecule.sh [scenario ...]      (default: all but lab_host)
# Scenarios run GPUAAS_MOLECULE_WORKERS at a time (default 2), longest first; each one's
# output goes to build/molecule/<scenario>.log and a failing one's tail is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$root/ansible.cfg"
export ANSIBLE_FORCE_COLOR=0 NO_COLOR=1 PY_COLORS=0

if [ "$(id -u)" -ne 0 ]; then
  echo "molecule: skipped (targets need root: network namespaces, loop devices, libvirtd)"
  exit 0
fi
command -v molecule >/dev/null || { echo "molecule: not installed; run scripts/setup.sh" >&2; exit 1; }

# Longest first, so two workers finish together (the two that boot a lab host lead).
all=(slice_storage_transition slice_disk_wipe slice_network_baseline slice_vm_provision
     slice_vm_release slice_host_bootstrap slice_parity)
# Run only when named: lab_host bootstraps a third TCG guest for 25 minutes and more, and
# `make test`'s lab-host tests already take the same playbooks through a deploy's first
# boot, a second run over SSH and a reboot to parity (tests/integration/hostlab).
on_request=(lab_host)
for dir in molecule/*/molecule.yml; do
  name=$(basename "$(dirname "$dir")")
  [[ " ${all[*]} ${on_request[*]} " == *" $name "* ]] || all+=("$name")
done
scenarios=("${@:-${all[@]}}")
workers=${GPUAAS_MOLECULE_WORKERS:-2}
logs=$root/build/molecule
mkdir -p "$logs"
# Scenario state lives in Molecule's per-scenario directories: one run at a time.
exec 9>"$root/build/molecule.lock"
flock 9
started=$SECONDS

run_one() {
  local name=$1 begin=$SECONDS rc=0
  molecule test -s "$name" >"$logs/$name.log" 2>&1 || rc=$?
  echo "$name rc=$rc $((SECONDS - begin))s" >"$logs/$name.status"
}

running=0
for name in "${scenarios[@]}"; do
  [ -f "molecule/$name/molecule.yml" ] || { echo "molecule: no scenario $name" >&2; exit 2; }
  rm -f "$logs/$name.status"
  run_one "$name" &
  running=$((running + 1))
  if [ "$running" -ge "$workers" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true

failed=0
for name in "${scenarios[@]}"; do
  status=$(cat "$logs/$name.status" 2>/dev/null || echo "$name rc=? (no status)")
  echo "molecule: $status"
  if [[ "$status" != *" rc=0 "* ]]; then
    failed=$((failed + 1))
    echo "---- tail of $logs/$name.log"
    tail -n 60 "$logs/$name.log" || true
  fi
done
echo "molecule: ${#scenarios[@]} scenario(s), $failed failed, $((SECONDS - started))s"
[ "$failed" -eq 0 ]
