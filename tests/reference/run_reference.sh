#!/bin/sh
# Compare Chorus's trainer with the independent PyTorch GPT-2 in gpt2_reference.py:
# random GPT-2 weights and a token file, then 1 and 10 steps in both, then the
# relative differences of losses and weights (pass: loss 1e-5, weights 3e-4).
#   tests/reference/run_reference.sh [BUILD_DIR] [WORK_DIR]
# Needs torch and numpy (Debian: apt-get install python3-torch python3-numpy) and
# build/bin/chorus-bench-reference. Extra training options can be set in OPTS.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
work=${2:-$(mktemp -d)}
py=${PYTHON:-/usr/bin/python3}
bench=$build/bin/chorus-bench-reference
OPTS=${OPTS:---heads 4 --batch 4 --microbatches 2 --lr 1e-3 --seed 1337}

"$py" "$here/gpt2_reference.py" make "$work" --layers 2 --heads 4 --embd 64 --vocab 50 --seq-len 32
status=0
for steps in 1 10; do
    warmup=$((steps < 3 ? steps : 3))
    # shellcheck disable=SC2086
    "$bench" "$work/init.safetensors" "$work/tokens.bin" $steps "$work/chorus-$steps.safetensors" $OPTS --warmup $warmup \
        > "$work/chorus-$steps.log"
    # shellcheck disable=SC2086
    "$py" "$here/gpt2_reference.py" train "$work/init.safetensors" "$work/tokens.bin" $steps \
        "$work/torch-$steps.safetensors" $OPTS --warmup $warmup > "$work/torch-$steps.log"
    echo "== $steps step(s)"
    "$py" "$here/gpt2_reference.py" compare "$work/chorus-$steps.safetensors" \
        "$work/torch-$steps.safetensors" "$work/chorus-$steps.log" "$work/torch-$steps.log" || status=1
done
echo "files in $work"
exit $status
