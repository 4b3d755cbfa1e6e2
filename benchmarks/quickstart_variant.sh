#!/usr/bin/env bash
# One variant of the quickstart's training on a corpus already made (the quickstart's own:
# cp -r runs/00_quickstart/corpus data/qs), decoded on dev and test with the lexicon search.
# Same corpus, same seed: training on CPU repeats bit for bit, so two variants differ only by
# what their overrides change. Run with nothing else on the machine.
#
#   STEPS=700 bash benchmarks/quickstart_variant.sh NAME [asrlab train flags and KEY=VALUE overrides]
#   STEPS=0   bash benchmarks/quickstart_variant.sh NAME --max-minutes 3.8 optim.decay_by_clock=true
#   (CORPUS=data/qs by default; the experiment goes to data/x_NAME)
set -euo pipefail
name=$1; shift
corpus=${CORPUS:-data/qs}
asrlab=${ASRLAB:-.venv/bin/asrlab}
exp=data/x_$name
rm -rf "$exp"
t0=$(date +%s)
"$asrlab" train --config tiny --data "$corpus/train/data.list" --cv "$corpus/dev/data.list" --exp "$exp" \
    --max-steps "${STEPS:-700}" --resume none train.max_epochs=8 train.progress=false "$@" > "$exp.log" 2>&1
t1=$(date +%s)
for split in dev test; do
    "$asrlab" decode --exp "$exp" --data "$corpus/$split/data.list" --lexicon "$corpus/train/data.list" > "$exp.$split.txt" 2>&1
done
python3 - "$exp" "$name" "$((t1 - t0))" <<'PY'
import json, statistics, sys
exp, name, seconds = sys.argv[1:4]
m = [json.loads(line) for line in open(f"{exp}/metrics/rank0.jsonl")]
print(f"{name}: trained {seconds} s, {m[-1]['step']} steps, median step {statistics.median(r['step_s'] for r in m):.3f} s")
PY
grep -h "CER" "$exp.dev.txt" "$exp.test.txt"
