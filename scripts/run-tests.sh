#!/usr/bin/env bash
# The two test tiers (docs/testing.md, "Test tiers"); pytest markers decide where a test runs
# (tests/tiers.py), the scenario's name where a Molecule scenario runs (scripts/molecule.sh).
#
#   scripts/run-tests.sh test   make test, what CI runs: lint, unit and integration tests,
#                               ansible-test sanity, the Molecule scenarios that need no lab
#                               host, and the lab-host smoke (a deployed host to parity over
#                               SSH), which runs beside the others from the start: its host's
#                               first boot is the longest wait of the tier.
#   scripts/run-tests.sh lab    make test-lab: the tests marked `lab` (the other lab-host
#                               tests, large labs) and Molecule's lab_* scenarios, side by
#                               side.
#
# Every phase runs even when one before it failed, so one run shows every failure. The tier
# ends with a table of its phases, slowest tests and xdist workers (scripts/test_report.py),
# from what it recorded in build/test-report/<tier>/.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$PWD/ansible.cfg"

tier=${1:-test}
case $tier in
  test) target="make test" ;;
  lab) target="make test-lab" ;;
  *) echo "usage: scripts/run-tests.sh test|lab" >&2; exit 2 ;;
esac
report=$PWD/build/test-report/$tier
rm -rf "$report"
mkdir -p "$report"
export GPUAAS_TEST_REPORT=$report
workers=${GPUAAS_TEST_WORKERS:-2}
hz=$(getconf CLK_TCK)
began=$SECONDS
tier_start=$EPOCHREALTIME

# Busy CPU time of the whole machine so far, in clock ticks (user, nice, system, irq,
# softirq, steal).
busy_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }

# record NAME START TICKS RC: one row of the report's phase table (ticks: busy_ticks at START).
record() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$EPOCHREALTIME" \
    "$(awk -v t="$(($(busy_ticks) - $3))" -v hz="$hz" 'BEGIN{print t / hz}')" "$4" \
    >>"$report/phases.tsv"
}
tier_ticks=$(busy_ticks)

# run_phase NAME COMMAND...: runs and times one phase, recording it for the report; the
# command runs under "${niced[@]}" when that is set.
niced=()
run_phase() {
  local name=$1 start=$EPOCHREALTIME ticks rc=0
  shift
  ticks=$(busy_ticks)
  echo "== $name (at $(((SECONDS - began) / 60)) min)"
  "${niced[@]}" "$@" || rc=$?
  record "$name" "$start" "$ticks" "$rc"
  echo "== $name: exit $rc (at $(((SECONDS - began) / 60)) min)"
  return "$rc"
}

# in_background NAME COMMAND...: a phase beside the others, its output kept in its own log
# (printed when it is waited for) so it does not interleave with theirs.
in_background() {
  local name=$1
  shift
  echo "== $name: started beside the others (output: $report/${name// /-}.log)"
  "$@" >"$report/${name// /-}.log" 2>&1 &
}

# waited NAME PID: the background phase's exit code, once its output is shown.
waited() {
  local rc=0
  wait "$2" || rc=$?
  echo "== output of $1"
  cat "$report/${1// /-}.log"
  return "$rc"
}

# pytest_phase NAME PYTEST-ARGS...: a pytest phase whose test timings go to the report.
pytest_phase() {
  local name=$1
  shift
  run_phase "$name" pytest -p no:cacheprovider --timings "$report/${name// /-}.jsonl" "$@"
}

failed=()
if [ "$tier" = test ]; then
  # The smoke is the tier's longest path, and most of it is one TCG guest (one thread): the
  # phases beside it run niced, so the guest gets a core whenever it wants one and they take
  # every cycle it leaves (on 2 cores the smoke took 1,441 s of a 1,497 s tier without this).
  in_background "lab-host smoke" pytest_phase "lab-host smoke" -m "labhost and smoke" \
    tests/integration/hostlab
  smoke=$!
  niced=(nice -n 10)
  run_phase "lint" scripts/lint.sh || failed+=("lint")
  pytest_phase "unit and integration tests" -n "$workers" --dist loadgroup \
    -m "not lab and not labhost" tests || failed+=("unit and integration tests")
  # ansible-test runs its checks one at a time: Molecule's two workers use the other core.
  in_background "ansible-test sanity" run_phase "ansible-test sanity" scripts/sanity.sh
  sanity=$!
  run_phase "Molecule" scripts/molecule.sh --tier test || failed+=("Molecule")
  waited "ansible-test sanity" "$sanity" || failed+=("ansible-test sanity")
  waited "lab-host smoke" "$smoke" || failed+=("lab-host smoke")
else
  in_background "Molecule lab scenarios" run_phase "Molecule lab scenarios" \
    scripts/molecule.sh --tier lab
  molecule=$!
  pytest_phase "lab-host tests" -m "labhost and lab" tests/integration/hostlab \
    || failed+=("lab-host tests")
  waited "Molecule lab scenarios" "$molecule" || failed+=("Molecule lab scenarios")
  pytest_phase "large lab tests" -n "$workers" --dist loadgroup -m "lab and not labhost" tests \
    || failed+=("large lab tests")
fi
record "total" "$tier_start" "$tier_ticks" "${#failed[@]}"

python scripts/test_report.py "$report"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "$target failed: ${failed[*]}" >&2
  exit 1
fi
echo "$target: every phase passed"
