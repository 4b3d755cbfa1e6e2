#!/usr/bin/env bash
# What a short two-rank `asrlab train` costs in CPU, every process of it counted (benchmarks/suite_cpu.py samples
# /proc): the ranks forked from a process that imported torch once (ASRLAB=. , the tree as it is) against another
# tree's launcher (ASRLAB=/path/to/other/checkout). Three runs each; the corpus is the tests' 120 tone utterances.
#   bash benchmarks/rank_start.sh [OTHER_TREE]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$PWD/.venv/bin/python
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd tests && $PY -c "
from conftest import tone_utts
from asrlab.data.shards import write_split
write_split(tone_utts(120), '$work/train', 'train', shard_size=12, raw=True)")
for tree in "$PWD" "${1:-}"; do
  [ -n "$tree" ] || continue
  for i in 1 2 3; do
    rm -rf "$work/exp"
    cat > "$work/one.sh" <<EOS
cd "$work" && PYTHONPATH="$tree" OMP_NUM_THREADS=1 $PY -m asrlab.cli train --nproc 2 --config tiny --data $work/train/data.list --exp $work/exp --max-steps 3 model.d_model=32 model.n_heads=2 model.n_layers=1 model.ff_dim=64 model.conv_kernel=3 model.conv_channels=8 data.num_workers=0 data.max_frames_in_batch=800 optim.warmup_steps=2 train.progress=false >/dev/null 2>&1
EOS
    echo "== $tree, run $i"
    $PY benchmarks/suite_cpu.py --out "$work/s.json" -- bash "$work/one.sh" | grep -E "exit|all$"
  done
done
