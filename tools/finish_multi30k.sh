#!/usr/bin/env bash
# Stops a running tools/train_multi30k.sh run, chooses how many of its last
# checkpoints to average by validation loss (tools/choose_average.py), then
# averages, stores and scores the preset as tools/train_multi30k.sh would.
# For runs that must end before the recipe's 8,000 updates (a time budget).
# Usage (from the repository root):  tools/finish_multi30k.sh de|fr
set -euo pipefail
tgt="$1"
DATA="${KERAS_TRANSFORMER_DATA:-../shared/data}/multi30k"
run="${RUNS:-runs}/multi30k_en_$tgt"

pkill -f "train_multi30k.sh $tgt" || true
pkill -f -- "--out $run\$" || true
while pgrep -f -- "--out $run\$" >/dev/null; do sleep 1; done   # checkpoints are written atomically

last=$(PYTHONPATH="$(pwd)" python tools/choose_average.py "$run" \
    --valid-src "$DATA/raw/val.en.gz" --valid-tgt "$DATA/raw/val.$tgt.gz" --candidates 1 3 5 10 \
    | tee "$run/choose_average.txt" | sed -n 's/^best: LAST=//p')
echo "averaging the last $last checkpoints"
LAST="$last" TRAIN=0 bash tools/train_multi30k.sh "$tgt"
