#!/usr/bin/env bash
# The checks that need a GPU, on a one-GPU box, stage by stage; what they write is packed into $OUT (or ./gpu_out).
#
#   bash benchmarks/on_gpu.sh STAGE [STAGE ...]
#   info         GPU, torch, and what --precision auto picks here and why
#   quickstart   notebooks/00_quickstart with notebooks/params/gpu1.yaml (tiny, the CPU clock, on the GPU)
#   quickstart8  notebooks/00_quickstart with gpu.yaml's 8-GPU block on this one GPU: nproc 1, its 8 ranks' 12,000
#                frames in one batch, a 4-min clock (synthesis, training and decoding must fit one 10-min call)
#   utilization  notebooks/02_gpu_utilization with gpu1.yaml (base model; NVML utilisation per setting)
#   nan          notebooks/03_nan_analysis with gpu1.yaml (fp16 on a real GPU)
#   resume       notebooks/04_resume with gpu1.yaml
#   recognition  tiny, a 6 x 256 conformer and base side by side on one GPU, on one corpus of 20,000 utterances,
#                each on a 5-min clock (noise augmentation as the CPU's 15-minute run; the larger two at x2
#                subsampling, 12,000-frame batches, cosine LR to the clock, no SpecAugment); test decoded with the
#                lexicon and the speed warps: does capacity close the held-out-accent gap?
#   cpu_budget   the same corpus; tiny and three larger variants in fp32, each for the steps 2 CPU cores make in
#                11 minutes: the GPU as a fast stand-in for the CPU's 15-minute run
#   precision    tiny, 300 steps each in fp32, bf16 and fp16 (GradScaler) on the same corpus: steps/s, loss, scale
#   tests        pytest tests/ on the GPU machine (the suite is written for CPU; this shows what a GPU changes)
#   gputests     only the tests that need a GPU (pytest -k gpu; they skip on CPU)
#   tune         asrlab tune (data.max_frames_by_length from measured peak memory) for tiny and base, on a
#                synthesized corpus, with fp16/bf16 as --precision auto picks
#   busy         benchmarks/busy_gpu.py: the base config at 4 workers and 12,000-frame batches, random batches
#                against duration buckets: NVML busy share, audio h/h, data wait, the wall clock split
#                (run gputests too: the steady-state step under sync debug mode "error")
#   features     benchmarks/busy_gpu.py --compare features: the same setting with the loader's fbank asrlab's, then
#                torchaudio's, then fbank on the device: NVML busy share and audio h/h of the sync-free step
#   watch        asrlab watch on examples/bare_loop.py (no asrlab line) on NCCL, one rank per GPU: a finished run, a
#                DataLoader worker hung at step 6 (--on-stall kill), an exception at step 8; each read by asrlab doctor
#   busy48k      busy at 48,000-frame batches (8 workers, 12,000 utterances): the step's time against the batch's size
#   lab          examples/lab_loop.py (asrlab.lab in a plain DDP loop) on NCCL with one rank per GPU, fp32 then
#                fp16 with the overflow injected, each read by asrlab doctor; with 2+ GPUs, notebook 05 on them
#   bare         benchmarks/bare_step.py --compile: the base config in bf16, asrlab's step beside a bare PyTorch
#                loop, eager then compiled (inductor), interleaved in one process
#   bound        asrlab watch (stacks and NVML, from outside) on three runs it must tell apart: a loader starved
#                of workers ("data"), a small batch ("host"), the compiled large-batch step ("device"); each
#                read by asrlab doctor, whose step times name the bound (BOUND_RUNS="starved small": those alone)
#
#   forked       asrlab train --nproc 1 --max-restarts 1 (torchrun's path: the rank forked from the warm forkserver) on
#                NCCL, 40 steps of tiny, read by asrlab doctor
#
# Packages the GPU machine's image lacks travel as wheels in .whl/ (git-ignored, carried): they are unpacked into
# /tmp/site, which goes on PYTHONPATH. ASRLAB_PY: the Python that holds asrlab and its dependencies (default python3). 01_stalls needs 2 ranks and
# nccl refuses two ranks on one GPU, so it is not run here.
set -uo pipefail
py=${ASRLAB_PY:-python3}
out=${OUT:-gpu_out}
mkdir -p "$out" runs
if [ -d .whl ] && [ ! -d /tmp/site ]; then
    "$py" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH  # py-spy
params=notebooks/params/gpu1.yaml
pack() { tar czf "$out/gpu_runs.tar.gz" runs/*/results.json runs/*/*.ipynb runs/*.log runs/tune_*.json runs/busy_gpu.json runs/busy_gpu48k.json runs/busy_features.json figures runs/precision 2>/dev/null; }
notebook() { timeout "$2" "$py" -m asrlab.cli notebooks --only "$1" --params "$params" 2>&1 | tee "runs/$1.log"; }
for stage in "$@"; do
    echo "=== $stage $(date -u +%H:%M:%S)"
    case $stage in
    info)
        nvidia-smi -L
        "$py" - <<'EOF'
import torch
from asrlab.lab.precision import capability_table
d = torch.device("cuda", 0)
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(d),
      "capability", torch.cuda.get_device_capability(d),
      "bf16 native", torch.cuda.is_bf16_supported(including_emulation=False))
for row in capability_table(d):
    print(row)
EOF
        ;;
    quickstart) notebook quickstart 420 ;;
    quickstart8)
        "$py" - <<'PY'
import yaml
p = yaml.safe_load(open("notebooks/params/gpu.yaml"))
q = dict(p["00_quickstart"], max_minutes=4.0)
q["overrides"] = q["overrides"] + ["data.max_frames_in_batch=12000", "data.num_workers=4"]
yaml.safe_dump({"nproc": 1, "precision": p["precision"], "00_quickstart": q}, open("runs/gpu8_on1.yaml", "w"))
PY
        params=runs/gpu8_on1.yaml notebook quickstart 560 ;;
    utilization) notebook utilization 420 ;;  # 5,000 utterances synthesized and packed three ways first
    nan) notebook nan 300 ;;
    resume) notebook resume 200 ;;
    recognition|cpu_budget)
        r=runs/recognition
        mkdir -p $r "$out/$stage"
        [ -f $r/corpus/train/data.list ] || "$py" -m asrlab.cli synth $r/corpus --utts 20000 > $r/synth.log 2>&1
        fit() {  # NAME CONFIG ARGS...: train, then decode test with the lexicon (on the GPU)
            local name=$1 config=$2 o="$out/$stage/$1"; shift 2
            timeout -k 10 380 "$py" -m asrlab.cli train --config "$config" --data $r/corpus/train/data.list \
                --exp $r/$name train.max_epochs=100 data.noise_aug=0.5 data.num_workers=4 "$@" > $o.train.log 2>&1
            cp $r/$name/metrics/rank0.jsonl $o.metrics.jsonl
            echo "$name trained: $(tail -n 1 $r/$name/metrics/rank0.jsonl | cut -c1-100)"
            timeout -k 10 170 "$py" -m asrlab.cli decode --exp $r/$name --data $r/corpus/test/data.list \
                --lexicon $r/corpus/train/data.list --speeds 0.9,1.0,1.1 > $o.decode.txt 2>&1
            cp $r/$name/decode/test_lexicon.txt $o.test_lexicon.txt
            grep CER $o.decode.txt
        }
        if [ $stage = recognition ]; then  # each on a 5-min clock
            clock="--max-minutes 5 optim.decay_by_clock=true"
            gpu="model.subsampling=2 optim.decay=cosine optim.min_lr=0.00001 data.spec_augment=false data.max_frames_in_batch=12000"
            fit tiny tiny $clock &  # the CPU's config as it is
            fit mid base $clock model.n_layers=6 model.ff_dim=1024 optim.warmup_steps=500 $gpu &   # 6 x 256, ~11M
            fit base base $clock optim.lr=0.0005 optim.warmup_steps=1000 $gpu &                    # 12 x 256, 33M
        else  # tiny and its variants in fp32, each for the steps 2 CPU cores make in 11 minutes (measured there)
            fit tiny tiny --precision fp32 --max-steps 3500 &                            # 0.19 s per step on CPU
            fit cc0 tiny --precision fp32 --max-steps 1700 model.conv_channels=0 &       # front end 144 wide: 0.39 s
            fit do1 tiny --precision fp32 --max-steps 2400 model.dropout=0.1 &           # 0.27 s
            fit w192 tiny --precision fp32 --max-steps 1600 model.d_model=192 model.ff_dim=768 model.n_layers=6 &  # 0.42 s
        fi
        wait
        ;;
    precision)
        corpus=runs/precision/corpus
        [ -f $corpus/train/data.list ] || "$py" -m asrlab.cli synth $corpus --utts 3000 > /dev/null
        for p in fp32 bf16 fp16; do
            timeout 240 "$py" -m asrlab.cli train --config tiny --data $corpus/train/data.list --exp runs/precision/$p \
                --precision $p --max-steps 300 data.num_workers=4 2>&1 | grep -i "precision\|error" | head -5
            "$py" - runs/precision/$p <<'EOF'
import sys, statistics
from asrlab.lab.metrics import read_metrics
m = read_metrics(sys.argv[1])
late = m[len(m) // 2:]
print(f"{sys.argv[1]}: {len(m)} steps, median step {1000 * statistics.median(r['step_s'] for r in late):.1f} ms, "
      f"data wait {1000 * statistics.median(r['data_wait_s'] for r in late):.1f} ms, last loss {m[-1]['loss']:.3f}, "
      f"skipped {m[-1]['skipped']}, loss scale first/last {m[0]['loss_scale']} / {m[-1]['loss_scale']}")
EOF
        done
        ;;
    forked)
        c=runs/forked/corpus
        [ -f $c/train/data.list ] || "$py" -m asrlab.cli synth $c --utts 400 --quiet
        rm -rf runs/forked/ok
        NCCL_DEBUG=VERSION timeout 200 "$py" -m asrlab.cli train --nproc 1 --max-restarts 1 --config tiny \
            --data $c/train/data.list --exp runs/forked/ok --max-steps 40 > runs/forked/ok.log 2>&1
        echo "healthy: exit $?"; grep -h "NCCL version\|rank 0/1\|Error\|error" runs/forked/ok.log | head -5
        "$py" -m asrlab.cli doctor runs/forked/ok | head -12 ;;
    tests) timeout 420 "$py" -m pytest tests -q -x --timeout 180 -p no:cacheprovider 2>&1 | tail -40 ;;
    lab)
        n=$(nvidia-smi -L | wc -l)
        for run in "fp32:none:-1:-1" "fp16:overflow:0:6"; do
            prec=${run%%:*}; fault=${run#*:}; exp=$PWD/runs/lab_gpu_$prec
            rm -rf "$exp"
            (cd examples && TOY_FAULT=$fault timeout 300 "$py" -m torch.distributed.run --standalone \
                --nproc-per-node "$n" lab_loop.py "$exp" 2 "$prec") 2>&1 | tail -5
            "$py" -m asrlab.cli doctor "$exp" | tee "runs/lab_gpu_$prec.doctor.txt"
        done
        if [ "$n" -ge 2 ]; then
            echo "nproc: $n" > runs/lab_params.yaml
            timeout 560 "$py" -m asrlab.cli notebooks --only your_loop --params runs/lab_params.yaml 2>&1 | tee runs/your_loop.log
        fi ;;
    watch)
        n=$(nvidia-smi -L | wc -l)
        for run in "none:-1:-1" "hang_data:0:6" "raise:0:8"; do
            exp=$PWD/runs/watch_gpu_${run%%:*}
            rm -rf "$exp"
            (cd examples && TOY_FAULT=$run timeout 200 "$py" -m asrlab.cli watch --exp "$exp" --stall-timeout 20 \
                --on-stall kill -- "$py" -m torch.distributed.run --standalone --nproc-per-node "$n" bare_loop.py \
                "$exp/loop" 2) > "runs/watch_gpu_${run%%:*}.log" 2>&1
            echo "$run: exit $? in $(grep -c . "runs/watch_gpu_${run%%:*}.log") lines of output"
            "$py" -m asrlab.cli doctor "$exp" | tee "runs/watch_gpu_${run%%:*}.doctor.txt" | head -12
        done
        tar czf "$out/watch_gpu.tar.gz" runs/watch_gpu_* 2>/dev/null ;;
    tune)
        [ -f runs/tune_corpus/train/data.list ] || "$py" -m asrlab.cli synth runs/tune_corpus --utts 300 --quiet
        for c in tiny base; do
            timeout 240 "$py" -m asrlab.cli tune runs/tune_corpus/train/data.list --config "$c" \
                --json "runs/tune_$c.json" 2>&1 | tee "runs/tune_$c.log"
        done ;;
    busy) timeout 560 "$py" benchmarks/busy_gpu.py --config base --workers 4 --max-frames 12000 --steps 40 \
              --json runs/busy_gpu.json 2>&1 | tee runs/busy_gpu.log ;;
    features)  # fbank on the device computes plain fbank: SpecAugment and dither off in all three, to compare
        [ -f runs/busy_gpu/corpus/train/data.list ] || "$py" -m asrlab.cli synth runs/busy_gpu/corpus --utts 4000 --quiet
        timeout 560 "$py" benchmarks/busy_gpu.py runs/busy_gpu/corpus/train/data.list data.spec_augment=false \
            data.dither=0 --config base --workers 4 --max-frames 12000 --steps 40 --compare features \
            --json runs/busy_features.json 2>&1 | tee runs/busy_features.log ;;
    busy48k)  # four times the frames per batch: does the step's time grow with the batch, or is it the host's?
        [ -f runs/busy12k/corpus/train/data.list ] || "$py" -m asrlab.cli synth runs/busy12k/corpus --utts 12000 --quiet
        timeout 300 "$py" benchmarks/busy_gpu.py runs/busy12k/corpus/train/data.list --config base --workers 8 \
            --max-frames 48000 --steps 20 --json runs/busy_gpu48k.json 2>&1 | tee runs/busy_gpu48k.log ;;
    bare) timeout 560 "$py" benchmarks/bare_step.py --config base --steps 40 --rounds ${BARE_ROUNDS:-3} --compile \
              --set train.precision=bf16 data.max_frames_in_batch=12000 2>&1 | tee runs/bare_step.log ;;
    bound)
        [ -f runs/bound/corpus/train/data.list ] || "$py" -m asrlab.cli synth runs/bound/corpus --utts 3000 --quiet
        for run in "starved:data.num_workers=0 data.max_frames_in_batch=12000" \
                   "small:data.num_workers=4 data.max_frames_in_batch=1500" \
                   "compiled:data.num_workers=8 data.max_frames_in_batch=48000 train.compile=true"; do
            name=${run%%:*}; exp=$PWD/runs/bound/$name
            [[ " ${BOUND_RUNS:-starved small compiled} " == *" $name "* ]] || continue
            rm -rf "$exp"
            # the compiled run: inductor took 2.5 min for base's first shapes on an H200's 16 cores
            timeout $([ "$name" = compiled ] && echo 330 || echo 170) "$py" -m asrlab.cli watch --exp "$exp" -- "$py" -m asrlab.cli train --config base \
                --data runs/bound/corpus/train/data.list --exp "$exp/train" --max-steps 60 --precision bf16 \
                ${run#*:} > "runs/bound/$name.log" 2>&1
            "$py" -m asrlab.cli doctor "$exp" | tee "runs/bound/$name.doctor.txt" | grep -A3 "step times"
        done
        tar czf "$out/bound.tar.gz" runs/bound/*.log runs/bound/*.doctor.txt 2>/dev/null ;;
    gputests)  # the root conftest (nbval's notebooks) and its addopts left out: the image has no nbval
        timeout 200 "$py" -m pytest -o addopts= --confcutdir tests -q -rs --timeout 150 -p no:cacheprovider -k gpu --tb=short \
            tests/test_sync_free.py tests/test_train.py tests/test_tune.py tests/test_features.py 2>&1 | tail -60 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
    esac
    pack  # after every stage: a command stopped at its time limit still leaves what it finished
done
