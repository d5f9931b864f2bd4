#!/usr/bin/env bash
# Does style augmentation make executors read hand-written requests better? Builds a bank whose executors
# are trained like a reference bank's, on the same stream, with a share of each family's training requests
# restyled (`skillbank augment`: same record count, so the same training compute), then measures both banks
# with the same selectors on the stream's template held-out requests and on the hand-written sets. The styled
# arm is a copy of the stream whose training requests are restyled (OUT/stream): its executors and its routers
# learn from them; the held-out requests are the same.
#
#   STREAM=runs/streams/builtin-200-50 REFERENCE=runs/compare-cpu/methods/fsm/bank \
#     scripts/style_augment.sh OUT [FRACTION]
#
# CONFIG (default configs/compare.toml) gives the [train] recipe; it must be the recipe the reference bank
# was trained with (the script checks the shards' recorded configs before measuring). Families train one after
# another, each with the torch threads other processes leave free. Resumable: a finished family is skipped, a
# killed `learn` continues from its checkpoint, the selectors reuse their cached outputs. Results: OUT/selectors-styled and
# OUT/selectors-reference (selectors.md / selectors.json each).
set -euo pipefail
OUT=${1:?usage: style_augment.sh OUT [FRACTION]}
FRACTION=${2:-0.5}
PY=${PYTHON:-.venv/bin/python}
STREAM=${STREAM:?set STREAM (a skillbank stream directory)}
REFERENCE=${REFERENCE:?set REFERENCE (the bank trained without augmentation)}
CONFIG=${CONFIG:-configs/compare.toml}
SEED=${SEED:-0}
RECORDS=${RECORDS:-tests/fixtures/paraphrase_builtin.jsonl tests/fixtures/paraphrase_builtin_holdout.jsonl tests/fixtures/paraphrase_builtin_short.jsonl}
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
[ -d "$OUT/stream" ] || { cp -r "$STREAM" "$OUT/stream.tmp" && rm -f "$OUT/stream.tmp"/train/*.jsonl && mv "$OUT/stream.tmp" "$OUT/stream"; }
sb() { $PY -m skillbank "$@"; }

families=$($PY -c "from skillbank.data.stream import Stream; print(' '.join(Stream.load('$STREAM').family_keys))")
for f in $families; do
  [ -s "$OUT/stream/train/$f.jsonl" ] || sb augment "$STREAM/train/$f.jsonl" --out "$OUT/stream/train/$f.jsonl" --fraction "$FRACTION" \
    --seed "$SEED" --examples 2 2>&1 | tee "$OUT/logs/augment-$f.log"
done

learned() { [ -f "$OUT/bank/bank.json" ] && $PY -c "import json,sys; m=json.load(open('$OUT/bank/bank.json')); sys.exit(0 if '$1' in [s['name'] for s in m['shards']] else 1)"; }
for f in $families; do
  learned "$f" && continue
  echo "$(date +%T) learn $f"
  sb learn "$OUT/bank" --family "$f" --data "$OUT/stream/train/$f.jsonl" --catalog "$STREAM/catalog.json" --config "$CONFIG" \
    --recipe small-cpu >>"$OUT/logs/learn-$f.log" 2>&1
done

# The recipes must match, or the comparison measures the recipe, not the data.
$PY - "$OUT/bank" "$REFERENCE" <<'EOF'
import json, sys
styled, ref = (json.load(open(f"{d}/bank.json")) for d in sys.argv[1:3])
cfg = {s["name"]: s["training"]["config"] for s in ref["shards"]}
for s in styled["shards"]:
    if s["training"]["config"] != cfg.get(s["name"]):
        sys.exit(f"recipe of {s['name']} differs from the reference bank's: {s['training']['config']} vs {cfg.get(s['name'])}")
if styled["base"] != ref["base"]:
    sys.exit(f"base differs: {styled['base']} vs {ref['base']}")
print("recipes and base match the reference bank")
EOF

extra=()
for r in $RECORDS; do extra+=(--records "$r"); done
for arm in styled reference; do
  bank=$OUT/bank stream=$OUT/stream
  [ "$arm" = reference ] && bank=$REFERENCE stream=$STREAM
  echo "$(date +%T) selectors over the $arm bank"
  sb selectors --bank "$bank" --stream "$stream" --selectors oracle --selectors hashing-nb --selectors embed-lda-nb \
    "${extra[@]}" --out "$OUT/selectors-$arm" >>"$OUT/logs/selectors-$arm.log" 2>&1
done
echo "$(date +%T) done: $OUT/selectors-styled/selectors.md, $OUT/selectors-reference/selectors.md"
