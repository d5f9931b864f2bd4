#!/usr/bin/env bash
# Where a new FSM executor starts, measured on one GPU in minutes instead of CPU hours: the start rules of
# bench/init_strategies.py and Progressive-LoRA (routed by the same kind of Address Memory) trained with the
# method comparison's recipe (configs/compare.toml: 200 requests x 3 epochs per family, r64, float32), each
# as its own process on the one device (a 135M model leaves a GPU mostly idle, so they overlap).
#
#   scripts/gpu_init_starts.sh OUT [DEADLINE_SECONDS] [NEUTRAL_SIZES]
#
# CONFIG (default configs/compare.toml) chooses the recipe. OUT/<rule>.json: bench/init_strategies.py's
# figures for each rule (fresh, neutral at each size in NEUTRAL_SIZES, default "20x10 50x20 100x20");
# OUT/compare/: the runner's Progressive-LoRA run for O1 and O2 (results.json, report.md). Banks use word
# statistics and the lexical Address Memory (--scope-encoder none), so no sentence encoder is needed. Every
# process is stopped at DEADLINE_SECONDS (default 420); what finished is kept. Not part of the test suite: it
# needs a CUDA machine (a CPU runs it too, in hours). On the lent H200 the default sizes did not finish in 420 s
# (the 100x20 start alone took 175 s to build); "20x10 50x20" at 275 s did, but for 50x20's evaluation.
set -u
OUT=${1:?usage: scripts/gpu_init_starts.sh OUT [DEADLINE_SECONDS] [NEUTRAL_SIZES]}
DEADLINE=${2:-420}
SIZES=${3:-"20x10 50x20 100x20"}
PY=${PYTHON:-python3}
CONFIG=${CONFIG:-configs/compare.toml}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
common=(--config "$CONFIG" --scope-encoder none --batch-size 64 --banks "$OUT/banks")

timeout "$DEADLINE" "$PY" bench/init_strategies.py "${common[@]}" --rules fresh --json "$OUT/fresh.json" \
    >"$OUT/fresh.log" 2>&1 &
for size in $SIZES; do
    timeout "$DEADLINE" "$PY" bench/init_strategies.py "${common[@]}" --rules neutral --neutral-size "$size" \
        --json "$OUT/neutral-$size.json" >"$OUT/neutral-$size.log" 2>&1 &
done
for order in O1 O2; do
    timeout "$DEADLINE" "$PY" -m skillbank exp run --config "$CONFIG" --out "$OUT/compare" \
        --method progressive-routed --order "$order" --no-report >"$OUT/progressive-$order.log" 2>&1 &
done
wait
"$PY" -m skillbank exp report "$OUT/compare" >"$OUT/report.log" 2>&1 || echo "no report (see $OUT/report.log)"
for f in "$OUT"/*.log; do echo "== $f"; tail -n 4 "$f"; done
