#!/usr/bin/env bash
# configs/compare-small.toml on a 2-core CPU: order O1 and order O2 as two processes (one torch thread
# each), then FSM's second order and the frozen-base references of O2, which reuse cached outputs.
#   scripts/cpu_compare_small.sh [RUN_DIR]
set -u
RUN=${1:-runs/compare-small}
SB=${SKILLBANK:-skillbank}
C=configs/compare-small.toml
mkdir -p "$RUN/logs"
start=$(date +%s)
$SB run --config $C --out "$RUN" --order O1 --no-report >"$RUN/logs/O1.log" 2>&1 &
a=$!
sleep 60   # let O1 write config.json and convert nothing twice
$SB run --config $C --out "$RUN" --order O2 --method sft --method replay --method lwf --method ewc --method olora \
  --method progressive --no-report >"$RUN/logs/O2.log" 2>&1 &
b=$!
wait $a
$SB run --config $C --out "$RUN" --order O2 --method fsm --method base-skill --method base-oracle-fields --no-report \
  >"$RUN/logs/O2-cached.log" 2>&1
wait $b
$SB report "$RUN"
echo "wall $(( $(date +%s) - start )) s"
