#!/bin/sh
# A byte-level run on real text, Chorus against the PyTorch reference (gpt2_reference.py):
# the same init, the same bytes (text:FILE, each byte a token, vocab 256), the same steps
# and sampling; the validation loss of both at the end, and their relative difference.
#   tests/reference/bytes_run.sh [BUILD_DIR] [WORK_DIR] [STEPS]
# The text: /usr/share/common-licenses/* then /usr/share/doc/*/copyright, in name order,
# cut to 1,500,000 bytes; the last 150,000 are the validation set. Needs torch and numpy
# (Debian: python3-torch, python3-numpy). Pass: the two validation losses within 2%.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
work=${2:-$(mktemp -d)}
steps=${3:-600}
py=${PYTHON:-/usr/bin/python3}
mkdir -p "$work"
# shellcheck disable=SC2046
cat $(ls /usr/share/common-licenses/* | sort) $(ls /usr/share/doc/*/copyright | sort) 2>/dev/null |
    head -c 1500000 > "$work/text.txt"
head -c 1350000 "$work/text.txt" > "$work/train.txt"
tail -c 150000 "$work/text.txt" > "$work/val.txt"
"$py" "$here/gpt2_reference.py" make "$work" --layers 4 --heads 4 --embd 128 --vocab 256 \
    --seq-len 64 --tokens 100 > /dev/null
OPTS="--heads 4 --batch 16 --microbatches 1 --lr 2e-3 --warmup $((steps < 50 ? steps : 50)) --seed 1337"
VAL="--val text:$work/val.txt --eval-tokens 65536"
# shellcheck disable=SC2086
"$build/bin/chorus-bench-reference" "$work/init.safetensors" "text:$work/train.txt" "$steps" \
    "$work/chorus.safetensors" $OPTS $VAL > "$work/chorus.log"
# shellcheck disable=SC2086
"$py" "$here/gpt2_reference.py" train "$work/init.safetensors" "text:$work/train.txt" "$steps" \
    "$work/torch.safetensors" $OPTS $VAL > "$work/torch.log"
c=$(awk '/^val_loss/ {print $2}' "$work/chorus.log")
t=$(awk '/^val_loss/ {print $2}' "$work/torch.log")
c0=$(awk '/^step 0 / {print $4}' "$work/chorus.log")
echo "text $(wc -c < "$work/text.txt") bytes, $steps steps: first train loss $c0"
awk -v c="$c" -v t="$t" 'BEGIN {
    r = (c - t) / t; if (r < 0) r = -r
    printf "RESULT name=byte_level_val_loss value=%.4f unit=nats ref=pytorch ref_value=%.4f ratio=%.4f\n", c, t, c / t
    exit (r <= 0.02 ? 0 : 1) }'
