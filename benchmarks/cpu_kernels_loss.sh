#!/usr/bin/env bash
# Why the quickstart's numbers depend on the CPU: 30 steps of `asrlab train --config tiny` (the quickstart's model,
# seed and schedule) under the kernel choices another CPU would make, and each run's loss at its last step, to
# every digit; and whether a setting makes them agree (with its cost: the median step time).
#   ATEN_CPU_CAPABILITY      torch's own kernels: default (no vector unit), avx2, avx512 where the CPU has it
#   MKL_ENABLE_INSTRUCTIONS  MKL's matrix products: AVX, AVX2, AVX512
#   MKL_CBWR=COMPATIBLE      MKL's code path that gives the same results on every x86 CPU
#
#   bash benchmarks/cpu_kernels_loss.sh [DIR]      # DIR: default runs/cpu_kernels (its corpus is made once)
set -euo pipefail
dir=${1:-runs/cpu_kernels}
asrlab=${ASRLAB:-.venv/bin/asrlab}
[ -f "$dir/corpus/train/data.list" ] || "$asrlab" synth "$dir/corpus" --utts 300 --quiet
settings=(
    "this-cpu|"
    "aten-default|ATEN_CPU_CAPABILITY=default"
    "mkl-avx|MKL_ENABLE_INSTRUCTIONS=AVX"
    "mkl-compatible|MKL_CBWR=COMPATIBLE"
    "mkl-compatible+mkl-avx|MKL_CBWR=COMPATIBLE MKL_ENABLE_INSTRUCTIONS=AVX"
    "aten-default+mkl-compatible|ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE"
    "aten-default+mkl-compatible+mkl-avx|ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE MKL_ENABLE_INSTRUCTIONS=AVX"
)
for s in "${settings[@]}"; do
    name=${s%%|*}; envs=${s#*|}
    rm -rf "$dir/x_$name"
    env $envs "$asrlab" train --config tiny --data "$dir/corpus/train/data.list" --exp "$dir/x_$name" \
        --max-steps 30 --resume none train.progress=false > "$dir/x_$name.log" 2>&1
    python3 - "$dir/x_$name" "$name" "$envs" <<'PY'
import json, statistics, sys
exp, name, envs = sys.argv[1:4]
m = [json.loads(line) for line in open(f"{exp}/metrics/rank0.jsonl")]
print(f"{name:<36} {envs or '(none)':<72} step {m[-1]['step']}: loss {m[-1]['loss']!r:<20} "
      f"median step {statistics.median(r['step_s'] for r in m):.3f} s")
PY
done
