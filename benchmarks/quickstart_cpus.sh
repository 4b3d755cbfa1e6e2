#!/usr/bin/env bash
# The quickstart (notebook 00, its default parameters) as CPUs with other vector units would run it: the
# same seed and steps, the kernels chosen by the CPU changed through the libraries' own switches.
#   ATEN_CPU_CAPABILITY   torch's own kernels: default (no vector unit), avx2, avx512 where the CPU has it
# (MKL's choice, MKL_ENABLE_INSTRUCTIONS, left the first 30 steps' loss unchanged: benchmarks/cpu_kernels_loss.sh.)
# Each setting runs the whole notebook (`asrlab notebooks --only 00_quickstart`), nothing else running.
#
#   bash benchmarks/quickstart_cpus.sh [OUT]      # OUT: default runs/quickstart_cpus; a summary on stdout
#
# The summary: one line per setting, dev and test CER (lexicon search, then greedy) and the end-to-end time;
# OUT/quickstart_cpus.json holds the same (docs/results/quickstart_cpus.json is a copy, which the README quotes).
set -euo pipefail
out=${1:-runs/quickstart_cpus}
asrlab=${ASRLAB:-.venv/bin/asrlab}
mkdir -p "$out"
# name, then the environment it runs with
settings=(
    "this-cpu|"
    "aten-default|ATEN_CPU_CAPABILITY=default"
)
for s in "${settings[@]}"; do
    name=${s%%|*}; envs=${s#*|}
    [ -f "$out/$name/00_quickstart/results.json" ] || env $envs "$asrlab" notebooks --only 00_quickstart --out "$out/$name" > "$out/$name.log" 2>&1
done
python3 - "$out" "${settings[@]}" <<'PY'
import json, sys
out, settings = sys.argv[1], sys.argv[2:]
keep = ("steps", "dev_cer", "test_cer", "dev_cer_lexicon", "test_cer_lexicon", "test_wer_lexicon", "total_seconds")
runs = {}
for s in settings:
    name, envs = s.split("|", 1)
    r = json.load(open(f"{out}/{name}/00_quickstart/results.json"))
    runs[name] = {"env": envs, **{k: r[k] for k in keep}}
json.dump({"command": "bash benchmarks/quickstart_cpus.sh", "runs": runs}, open(f"{out}/quickstart_cpus.json", "w"), indent=1)
print(f"{'setting':<22} {'environment':<55} dev CER  test CER  (greedy dev / test)  seconds")
for s in settings:
    name, envs = s.split("|", 1)
    r = json.load(open(f"{out}/{name}/00_quickstart/results.json"))
    print(f"{name:<22} {envs or '(none)':<55} {100 * r['dev_cer_lexicon']:6.2f}%  {100 * r['test_cer_lexicon']:7.2f}%"
          f"  ({100 * r['dev_cer']:.2f}% / {100 * r['test_cer']:.2f}%)  {r['total_seconds']:7.0f}")
PY
