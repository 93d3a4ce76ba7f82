#!/usr/bin/env bash
# Every role's Molecule scenario (molecule/*/): syntax, check, converge, idempotence, verify
# against isolated targets built on this machine (network + mount namespaces, loop disks,
# the VM lab; see molecule/shared/target.py) and, for the lab_* scenarios, a Debian host under
# QEMU booted by `gpuaas lab host up`. Needs root; without it, says why and skips.
#
# Usage: scripts/molecule.sh [--tier test|lab] [scenario ...]
#   --tier test   every scenario that needs no lab host (make test; the default)
#   --tier lab    the lab_* scenarios, each on a lab host (make test-lab)
# Scenarios run GPUAAS_MOLECULE_WORKERS at a time (default 2, 1 for --tier lab), longest
# first; each one's output goes to build/molecule/<scenario>.log and a failing one's tail is
# printed. Each action's start and end go to $GPUAAS_TEST_REPORT/molecule-<scenario>.tsv
# (default build/molecule), for scripts/test_report.py.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$root/ansible.cfg"
export ANSIBLE_FORCE_COLOR=0 NO_COLOR=1 PY_COLORS=0

tier="test"
if [ "${1:-}" = --tier ]; then
  tier=${2:?--tier takes test or lab}
  shift 2
fi
case $tier in
  test | lab) ;;
  *) echo "molecule: --tier takes test or lab, not $tier" >&2; exit 2 ;;
esac

if [ "$(id -u)" -ne 0 ]; then
  echo "molecule: skipped (targets need root: network namespaces, loop devices, libvirtd)"
  exit 0
fi
command -v molecule >/dev/null || { echo "molecule: not installed; run scripts/setup.sh" >&2; exit 1; }

# Longest first, so two workers finish together; a scenario not listed runs last.
longest_first=(lab_host lab_storage_transition lab_disk_wipe
               slice_vm_provision slice_vm_release slice_network_baseline slice_storage_transition
               slice_disk_wipe slice_host_bootstrap slice_parity slice_image_cache)
all=()
for name in "${longest_first[@]}"; do
  [ -f "molecule/$name/molecule.yml" ] && all+=("$name")
done
for dir in molecule/*/molecule.yml; do
  name=$(basename "$(dirname "$dir")")
  [[ " ${all[*]} " == *" $name "* ]] || all+=("$name")
done
# The scenario's name says its tier: lab_* boot a lab host (a TCG guest that bootstraps for
# many minutes), the others need none.
tiered=()
for name in "${all[@]}"; do
  if [[ $name == lab_* ]]; then [ "$tier" = lab ] && tiered+=("$name")
  else [ "$tier" = test ] && tiered+=("$name"); fi
done
scenarios=("${@:-${tiered[@]}}")
# A lab scenario's TCG guest wants a core of its own (make test-lab runs two lab hosts
# beside them): one lab scenario at a time, two of the others.
if [ "$tier" = lab ]; then default_workers=1; else default_workers=2; fi
workers=${GPUAAS_MOLECULE_WORKERS:-$default_workers}
logs=$root/build/molecule
timings=${GPUAAS_TEST_REPORT:-$logs}
mkdir -p "$logs" "$timings"
# Scenario state lives in Molecule's per-scenario directories: one run at a time.
exec 9>"$root/build/molecule.lock"
flock 9
started=$SECONDS

# Copies Molecule's output through, recording when each action of scenario $1 began and
# ended (Molecule logs "[scenario > action] Executing" and "... Executed: <outcome>").
stamp_actions() {
  local name=$1 line action="" began=""
  while IFS= read -r line; do
    printf '%s\n' "$line"
    if [[ $line =~ \[$name\ \>\ ([a-z_]+)\]\ Executing ]]; then
      action=${BASH_REMATCH[1]}
      began=$EPOCHREALTIME
    elif [[ $line =~ \[$name\ \>\ ([a-z_]+)\]\ Executed ]] && [ -n "$began" ]; then
      printf '%s\t%s\t%s\n' "$action" "$began" "$EPOCHREALTIME" >>"$timings/molecule-$name.tsv"
      began=""
    fi
  done
}

run_one() {
  local name=$1 begin=$SECONDS rc=0
  rm -f "$timings/molecule-$name.tsv"
  molecule test -s "$name" 2>&1 | stamp_actions "$name" >"$logs/$name.log" || rc=$?
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
