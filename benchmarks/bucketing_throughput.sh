#!/usr/bin/env bash
# Training throughput on CPU with the default sort windows against duration buckets (data.bucketing=true):
# asrlab bench train (the real model, loader and trainer; hours of audio trained per hour of wall clock)
# on the embedded corpus, the two settings alternating for ROUNDS rounds. Writes benchmarks/bucketing_throughput.txt.
#
#   bash benchmarks/bucketing_throughput.sh [CORPUS_DIR] [ROUNDS] [STEPS]
set -euo pipefail
corpus=${1:-/tmp/asrlab_padding/embedded}
rounds=${2:-3}
steps=${3:-40}
asrlab=${ASRLAB:-.venv/bin/asrlab}
py=${ASRLAB_PY:-.venv/bin/python}
out=benchmarks/bucketing_throughput.txt
[ -f "$corpus/train/data.list" ] || "$asrlab" synth "$corpus" --utts 2000 --quiet
{
    echo "\$ bash benchmarks/bucketing_throughput.sh $corpus $rounds $steps"
    echo "tiny config, data.num_workers 0, max_frames_in_batch 2500, $steps measured steps per run, 1,000 utterances re-written as shards"
    for r in $(seq 1 "$rounds"); do
        for mode in windows buckets; do
            extra=(); [ "$mode" = buckets ] && extra=(data.bucketing=true)
            json=$(mktemp)
            "$asrlab" bench train "$corpus/train/data.list" --num-workers 0 --max-frames 2500 --steps "$steps" \
                --json "$json" ${extra[@]+"${extra[@]}"} >/dev/null 2>&1
            "$py" -c 'import json, sys; r = json.load(open(sys.argv[1]))["rows"][0]
print("round %s %-8s steps/s %5.2f  utts/s %5.1f  audio h/h %5.1f  data wait %4.1f%%  peak %5.0f MiB" % (sys.argv[2],
      sys.argv[3], 1 / r["step_s"], r["utts_per_s"], r["audio_h_per_h"], 100 * r["data_wait"], r["peak_mib"]))' \
                "$json" "$r" "$mode"
            rm -f "$json"
        done
    done
    echo "steps/s, utterances/s and audio h/h (hours of audio trained per hour of wall clock) over the measured steps"
} | tee "$out"
