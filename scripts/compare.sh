#!/usr/bin/env bash
# The method comparison (configs/compare.toml) plus the access-vs-execution diagnostics, as separate
# processes into one run directory: FSM (both orders in one process, since they share one bank), every
# other method once per order, and `skillbank exp diagnose`. At most JOBS processes run at once; on a GPU a
# 135M model leaves the device mostly idle, so many can overlap, while on a CPU use one per core with
# one torch thread each (THREADS=1, or the config's [base] threads). Every run is resumable: rerunning the script
# skips finished stages, so a comparison too long for one sitting is finished by running it again.
#
#   JOBS=2 THREADS=1 CONFIG=my.toml scripts/compare.sh RUN_DIR [DEADLINE_SECONDS]
#
# Jobs start in the order listed in JOB_ORDER (default: FSM, then the config's other methods in its order,
# then the diagnostics), each method's two orders next to each other so that partial results stay
# comparable across orders. When every job has finished, `skillbank exp reactivate` probes the final
# checkpoints of LwF, EWC and O-LoRA with the correct skill address (REACTIVATE=0 skips it). Logs go
# to RUN_DIR/logs/. After the deadline (0 = none) every process still running is stopped (its
# finished stages stay on disk) and the report is written from what finished.
set -u
RUN=${1:?usage: compare.sh RUN_DIR [DEADLINE_SECONDS]}
DEADLINE=${2:-0}
CONFIG=${CONFIG:-configs/compare.toml}
JOBS=${JOBS:-32}
PY=${PYTHON:-python3}
FSM_PARALLEL=${FSM_PARALLEL:-5}
THREADS_ARG=${THREADS:+--threads $THREADS}   # torch threads per training process (not part of the run's identity)
# Default: the config's methods, FSM first (its parallel stages use the machine best early), then diagnose.
JOB_ORDER=${JOB_ORDER:-$($PY -c "
from skillbank.config import RunConfig
methods = RunConfig.from_toml('$CONFIG').methods
print(' '.join(['fsm'] * ('fsm' in methods) + [m for m in methods if m != 'fsm'] + ['diagnose']))")} || exit 1
mkdir -p "$RUN/logs"
export TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
start=$(date +%s)
$PY -c "from skillbank.model.base import ensure_embedded; ensure_embedded()" || exit 1   # convert once, not per process

jobs_list=()
for m in $JOB_ORDER; do
  case $m in
    fsm) jobs_list+=("fsm|run --config $CONFIG --out $RUN --method fsm --parallel-stages $FSM_PARALLEL --no-report $THREADS_ARG") ;;
    diagnose) jobs_list+=("diagnose|diagnose --config $CONFIG --out $RUN") ;;
    *) for o in O1 O2; do
         jobs_list+=("$m-$o|run --config $CONFIG --out $RUN --method $m --order $o --no-report $THREADS_ARG")
       done ;;
  esac
done

pids=()
stopped=0
past_deadline() { [ "$DEADLINE" -gt 0 ] && [ $(( $(date +%s) - start )) -ge "$DEADLINE" ]; }
running() { local n=0 p; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && n=$((n + 1)); done; echo $n; }
for job in "${jobs_list[@]}"; do
  while [ "$(running)" -ge "$JOBS" ] && ! past_deadline; do sleep 5; done
  past_deadline && break
  name=${job%%|*}
  echo "$(date +%T) start $name"
  # shellcheck disable=SC2086  # the argument string is split on purpose
  $PY -m skillbank ${job#*|} >>"$RUN/logs/$name.log" 2>&1 &
  pids+=($!)
done
while [ "$(running)" -gt 0 ]; do
  if past_deadline; then
    echo "deadline reached with $(running) process(es) running: stopping them"
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    sleep 3
    stopped=1
    break
  fi
  sleep 5
done
echo "processes done after $(( $(date +%s) - start )) s (stopped at deadline: $stopped)"
if [ "$stopped" = 0 ] && [ "${REACTIVATE:-1}" = 1 ]; then
  # the paper's "w/ correct skill address" rows: LwF, EWC and O-LoRA's final checkpoints with the address
  echo "$(date +%T) start reactivate"
  $PY -m skillbank exp reactivate "$RUN" --no-report >>"$RUN/logs/reactivate.log" 2>&1 || echo "reactivate failed"
fi
for f in "$RUN"/logs/*.log; do
  if grep -q "Traceback\|^error" "$f"; then echo "== $f"; tail -5 "$f"; fi
done
$PY -m skillbank exp report "$RUN" || echo "report failed"
echo "total $(( $(date +%s) - start )) s"
