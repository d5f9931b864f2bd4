#!/usr/bin/env bash
# The method comparison (configs/compare.toml) plus the access-vs-execution diagnostics on one GPU, as
# separate processes into one run directory: FSM (both orders in one process, its five stages trained in
# parallel), every other method once per order, and `skillbank diagnose`. A 135M model leaves a large
# GPU mostly idle, so the processes overlap; each run is resumable, so an interrupted one can be rerun.
#
#   scripts/device_compare.sh RUN_DIR [DEADLINE_SECONDS]
#
# Logs go to RUN_DIR/logs/. After the deadline every process still running is stopped (its finished
# stages stay on disk) and the report is written from what finished.
set -u
RUN=${1:?usage: device_compare.sh RUN_DIR [DEADLINE_SECONDS]}
DEADLINE=${2:-3000}
CONFIG=${CONFIG:-configs/compare.toml}
PY=${PYTHON:-python3}
mkdir -p "$RUN/logs"
export TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
start=$(date +%s)
$PY -c "from skillbank.model.base import ensure_embedded; ensure_embedded()" || exit 1   # convert once, not per process
pids=()
$PY -m skillbank run --config "$CONFIG" --out "$RUN" --method fsm --parallel-stages 5 --no-report >"$RUN/logs/fsm.log" 2>&1 &
pids+=($!)
for m in sft replay lwf ewc olora progressive base-skill base-oracle-fields; do
  for o in O1 O2; do
    $PY -m skillbank run --config "$CONFIG" --out "$RUN" --method "$m" --order "$o" --no-report >"$RUN/logs/$m-$o.log" 2>&1 &
    pids+=($!)
  done
done
$PY -m skillbank diagnose --config "$CONFIG" --out "$RUN" >"$RUN/logs/diagnose.log" 2>&1 &
pids+=($!)
while :; do
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
  now=$(date +%s)
  [ "$alive" -eq 0 ] && break
  if [ $((now - start)) -ge "$DEADLINE" ]; then
    echo "deadline reached with $alive process(es) running: stopping them"
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    sleep 3
    break
  fi
  sleep 5
done
echo "processes done after $(( $(date +%s) - start )) s"
for f in "$RUN"/logs/*.log; do
  if grep -q "Traceback\|^error" "$f"; then echo "== $f"; tail -5 "$f"; fi
done
$PY -m skillbank report "$RUN" || echo "report failed"
echo "total $(( $(date +%s) - start )) s"
