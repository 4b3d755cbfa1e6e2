#!/usr/bin/env bash
# Recognition within a wall-clock budget, end to end: synthesize a corpus, train the tiny config
# for a fixed time (optim.decay_by_clock: its cosine LR decay ends with the clock), decode the held-out test voices.
# Prints each stage's seconds and the total. Run with nothing else on the machine.
#
#   bash benchmarks/recognition_budget.sh [UTTS] [TRAIN_MINUTES] [OUT] [KEY=VALUE ...]
#   (defaults: 20000 11.5 runs/budget; KEY=VALUE: config overrides for the training;
#    SPEEDS=0.9,1.0,1.1 by default: the decoding's test-time warps, asrlab decode --speeds; SPEEDS=1 for none)
#
# The whole test split is decoded (utts / 10 utterances; its first 300 are data/corpus's test).
set -euo pipefail
utts=${1:-20000}
minutes=${2:-11.5}
out=${3:-runs/budget}
shift $(( $# < 3 ? $# : 3 ))
asrlab=${ASRLAB:-.venv/bin/asrlab}
speeds=${SPEEDS:-0.9,1.0,1.1}
rm -rf "$out"
mkdir -p "$out"
t0=$(date +%s.%N)
"$asrlab" synth "$out/corpus" --utts "$utts" > "$out/synth.log" 2>&1
t1=$(date +%s.%N)
"$asrlab" train --config tiny --data "$out/corpus/train/data.list" --exp "$out/exp" \
    --max-minutes "$minutes" train.max_epochs=100 optim.decay_by_clock=true "$@" 2> "$out/train.log"
t2=$(date +%s.%N)
"$asrlab" decode --exp "$out/exp" --data "$out/corpus/test/data.list" \
    --lexicon "$out/corpus/train/data.list" --speeds "$speeds" | tee "$out/decode.txt"
t3=$(date +%s.%N)
steps=$(tail -n 1 "$out/exp/metrics/rank0.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')
python3 - "$t0" "$t1" "$t2" "$t3" "$steps" "$utts" "$minutes" <<'EOF'
import sys
t0, t1, t2, t3 = map(float, sys.argv[1:5])
print(f"utts {sys.argv[6]}, budget {sys.argv[7]} min: synth {t1 - t0:.0f} s, train {t2 - t1:.0f} s "
      f"({sys.argv[5]} steps), decode {t3 - t2:.0f} s; total {(t3 - t0) / 60:.1f} min")
EOF
