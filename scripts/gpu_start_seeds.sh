#!/usr/bin/env bash
# Issue 35's question with more than one seed: does FSM with a warm start (a new shard copied from the previous
# one) reach Progressive-LoRA routed by the same Address Memory, and how much of each gap is seed noise? One
# run on one GPU, every job its own process (a 135M model leaves the device mostly idle, so they overlap):
#
#   scripts/gpu_start_seeds.sh OUT [DEADLINE_SECONDS] [SEEDS]
#
# For each training seed in SEEDS (default "0 1 2"; [train] seed: LoRA initialisation and batch order, the
# stream's requests stay those of seed 0) with the method comparison's recipe (configs/compare.toml: 200
# requests x 3 epochs per family, r64, float32):
#   OUT/s<seed>/fresh-O1.json, previous-O1.json, previous-O2.json - bench/init_strategies.py's figures (template
#     held-out EM routed and Oracle per family, hand-written dev EM); a fresh shard does not depend on the order
#     and the lexical Address Memory's statistics are sums, so fresh's O1 figures stand for O2;
#   OUT/s<seed>/compare/ - the runner's progressive-routed run in O1 and O2 (after every stage: routed, Oracle,
#     stacked), whose last stage is the row to compare.
# Banks use word statistics and the lexical Address Memory (--scope-encoder none). Every process is stopped at
# DEADLINE_SECONDS (default 540); what finished is kept. Not part of the test suite: it needs a CUDA machine
# (a CPU runs it too, in about a day). Sizing, measured on the lent H200 (2026-12-04): with fifteen processes on
# the one GPU each needed 60-69 s to learn a family, and at 480 s the FSM banks were trained but not evaluated
# and Progressive-LoRA had finished three stages (results/init/gpu-h200-seeds/); with seven processes
# (scripts/gpu_init_starts.sh) a whole fresh bank was trained and evaluated inside 275 s. Run one seed per call.
# The banks (~30 MB a shard) are too large to bring back from a lent machine; keep the figures only, e.g.
#   scripts/gpu_start_seeds.sh /root/gss 420 "1"; cd /root/gss && find . \( -name '*.json' -o -name '*.log' \) \
#       -not -path '*banks-*' | tar czf "$OUT/gss.tgz" -T -
set -u
OUT=${1:?usage: scripts/gpu_start_seeds.sh OUT [DEADLINE_SECONDS] [SEEDS]}
DEADLINE=${2:-540}
SEEDS=${3:-"0 1 2"}
PY=${PYTHON:-python3}
# Fifteen processes on the lent machine's 16 cores: one thread each.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
for seed in $SEEDS; do
    dir="$OUT/s$seed"
    mkdir -p "$dir"
    # The comparison's recipe with this training seed (the stream's seed is untouched).
    sed "s/^\[train\]$/[train]\nseed = $seed/" configs/compare.toml >"$dir/config.toml"
    common=(--config "$dir/config.toml" --scope-encoder none --batch-size 64)
    timeout "$DEADLINE" "$PY" bench/init_strategies.py "${common[@]}" --banks "$dir/banks-fresh" --rules fresh \
        --json "$dir/fresh-O1.json" >"$dir/fresh-O1.log" 2>&1 &
    for order in O1 O2; do
        timeout "$DEADLINE" "$PY" bench/init_strategies.py "${common[@]}" --banks "$dir/banks-$order" \
            --rules previous --order "$order" --json "$dir/previous-$order.json" >"$dir/previous-$order.log" 2>&1 &
        timeout "$DEADLINE" "$PY" -m skillbank exp run --config "$dir/config.toml" --out "$dir/compare" \
            --method progressive-routed --order "$order" --no-report --threads 1 \
            >"$dir/progressive-$order.log" 2>&1 &
    done
done
wait
for f in "$OUT"/s*/*.log; do echo "== $f"; tail -n 3 "$f"; done
