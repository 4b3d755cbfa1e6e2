#!/usr/bin/env bash
# The checks that need a GPU, on a one-GPU box, stage by stage; what they write is packed into $OUT (or ./gpu_out).
#
#   bash benchmarks/on_gpu.sh STAGE [STAGE ...]
#   info         GPU, torch, and what --precision auto picks here and why
#   quickstart   notebooks/00_quickstart with notebooks/params/gpu1.yaml (tiny, the CPU clock, on the GPU)
#   utilization  notebooks/02_gpu_utilization with gpu1.yaml (base model; NVML utilisation per setting)
#   nan          notebooks/03_nan_analysis with gpu1.yaml (fp16 on a real GPU)
#   resume       notebooks/04_resume with gpu1.yaml
#   precision    tiny, 300 steps each in fp32, bf16 and fp16 (GradScaler) on the same corpus: steps/s, loss, scale
#   tests        pytest tests/ on the GPU machine (the suite is written for CPU; this shows what a GPU changes)
#   gputests     only the tests that need a GPU (pytest -k gpu; they skip on CPU)
#
# ASRLAB_PY: the Python that holds asrlab and its dependencies (default python3). 01_stalls needs 2 ranks and
# nccl refuses two ranks on one GPU, so it is not run here.
set -uo pipefail
py=${ASRLAB_PY:-python3}
out=${OUT:-gpu_out}
mkdir -p "$out" runs
params=notebooks/params/gpu1.yaml
pack() { tar czf "$out/gpu_runs.tar.gz" runs/*/results.json runs/*/*.ipynb runs/*.log figures runs/precision 2>/dev/null; }
notebook() { timeout "$2" "$py" -m asrlab.cli notebooks --only "$1" --params "$params" 2>&1 | tee "runs/$1.log"; }
for stage in "$@"; do
    echo "=== $stage $(date -u +%H:%M:%S)"
    case $stage in
    info)
        nvidia-smi -L
        "$py" - <<'EOF'
import torch
from asrlab.train.precision import capability_table
d = torch.device("cuda", 0)
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(d),
      "capability", torch.cuda.get_device_capability(d),
      "bf16 native", torch.cuda.is_bf16_supported(including_emulation=False))
for row in capability_table(d):
    print(row)
EOF
        ;;
    quickstart) notebook quickstart 420 ;;
    utilization) notebook utilization 240 ;;
    nan) notebook nan 300 ;;
    resume) notebook resume 200 ;;
    precision)
        corpus=runs/precision/corpus
        [ -f $corpus/train/data.list ] || "$py" -m asrlab.cli synth $corpus --utts 3000 > /dev/null
        for p in fp32 bf16 fp16; do
            timeout 240 "$py" -m asrlab.cli train --config tiny --data $corpus/train/data.list --exp runs/precision/$p \
                --precision $p --max-steps 300 data.num_workers=4 2>&1 | grep -i "precision\|error" | head -5
            "$py" - runs/precision/$p <<'EOF'
import sys, statistics
from asrlab.train.metrics import read_metrics
m = read_metrics(sys.argv[1])
late = m[len(m) // 2:]
print(f"{sys.argv[1]}: {len(m)} steps, median step {1000 * statistics.median(r['step_s'] for r in late):.1f} ms, "
      f"data wait {1000 * statistics.median(r['data_wait_s'] for r in late):.1f} ms, last loss {m[-1]['loss']:.3f}, "
      f"skipped {m[-1]['skipped']}, loss scale first/last {m[0]['loss_scale']} / {m[-1]['loss_scale']}")
EOF
        done
        ;;
    tests) timeout 420 "$py" -m pytest tests -q -x --timeout 180 -p no:cacheprovider 2>&1 | tail -40 ;;
    gputests) timeout 120 "$py" -m pytest tests -q --timeout 100 -p no:cacheprovider -k gpu 2>&1 | tail -15 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
    esac
    pack  # after every stage: a command stopped at its time limit still leaves what it finished
done
