#!/usr/bin/env bash
# Train the paper's base model (Table 3: N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1,
# 100k steps of ~25,000 source + 25,000 target tokens, 37k shared vocabulary) on
# several GPUs of one machine, or on several machines with JAX.
#
# Usage (run from anywhere; SRC/TGT/VALID_SRC/VALID_TGT name your data, one sentence a line):
#
#   # One machine, every visible GPU, TensorFlow's MirroredStrategy:
#   SRC=train.en TGT=train.de VALID_SRC=val.en VALID_TGT=val.de \
#       bash examples/train_distributed.sh mirrored
#
#   # Several machines with JAX: the same command on every host, PROCESS_ID 0..N-1;
#   # COORDINATOR is host 0's address and a free port (process 0 writes the run folder):
#   COORDINATOR=10.0.0.1:1234 NUM_PROCESSES=2 PROCESS_ID=0 SRC=... bash examples/train_distributed.sh jax   # host 0
#   COORDINATOR=10.0.0.1:1234 NUM_PROCESSES=2 PROCESS_ID=1 SRC=... bash examples/train_distributed.sh jax   # host 1
#
#   # A 2-step check on this computer's CPU with a tiny model (JAX splits each batch over 2
#   # CPU devices, through the same multi-process start-up with one process):
#   TINY=1 SRC=train.en TGT=train.de bash examples/train_distributed.sh jax
#
# Notes:
# - Batches are counted in tokens for the whole step: with 8 GPUs, 25000 tokens per batch
#   are ~3,100 per GPU. To keep the paper's batch on fewer devices, raise --accumulate
#   (JAX, or no strategy) rather than the batch: `--accumulate 2` sums two micro-batches.
# - `--strategy mirrored` is TensorFlow on one machine; TensorFlow's multi-worker strategy
#   fails inside Keras 3's fit (see keras_transformer/training/distribution.py), so several machines
#   means JAX.
# - Running the same command again resumes from the last checkpoint in --out. Afterwards:
#   keras-transformer average "$OUT" --last 5 --out presets/my_base_en_de   (section 6.1)
set -euo pipefail

MODE="${1:?usage: train_distributed.sh mirrored|jax}"
KT="${KERAS_TRANSFORMER:-keras-transformer}"   # the command (tests point it at their Python)
OUT="${OUT:-runs/base_en_de}"
SRC="${SRC:?set SRC to the training source file}"
TGT="${TGT:?set TGT to the training target file}"

# The paper's base model and recipe (the defaults of `train` are the paper's:
# 100k steps, warmup 4000, label smoothing 0.1, Adam 0.9/0.98/1e-9).
MODEL=(--preset transformer_base --vocab-size 37000 --tokens-per-batch 25000)
VALID=()
if [[ -n "${VALID_SRC:-}" ]]; then VALID=(--valid-src "$VALID_SRC" --valid-tgt "$VALID_TGT"); fi
EXTRA=()

if [[ -n "${TINY:-}" ]]; then
    # Tiny everything: 1 layer, d_model 16, a 64-piece vocabulary, 2 steps, no validation BLEU.
    MODEL=(--preset transformer_base --layers 1 --hidden-dim 16 --ff-dim 32 --heads 2
           --vocab-size 64 --max-length 32 --tokens-per-batch 256)
    EXTRA=(--max-steps 2 --warmup-steps 2 --checkpoint-every-steps 2 --valid-bleu-sentences 0 --verbose 2)
    if [[ "$MODE" == jax ]]; then
        export XLA_FLAGS="--xla_force_host_platform_device_count=2"   # 2 CPU "devices"
        COORDINATOR="${COORDINATOR:-127.0.0.1:$(( 20000 + RANDOM % 20000 ))}"
    fi
fi

case "$MODE" in
    mirrored)
        # Every GPU TensorFlow sees (choose with CUDA_VISIBLE_DEVICES=0,1,...).
        $KT train --backend tensorflow --strategy mirrored \
            --src "$SRC" --tgt "$TGT" "${VALID[@]}" "${MODEL[@]}" "${EXTRA[@]}" --out "$OUT"
        ;;
    jax)
        # Every JAX device of every process; without COORDINATOR, one host.
        HOSTS=()
        if [[ -n "${COORDINATOR:-}" ]]; then
            HOSTS=(--coordinator "$COORDINATOR" --num-processes "${NUM_PROCESSES:-1}"
                   --process-id "${PROCESS_ID:-0}")
        fi
        $KT train --backend jax --strategy jax-data-parallel "${HOSTS[@]}" \
            --src "$SRC" --tgt "$TGT" "${VALID[@]}" "${MODEL[@]}" "${EXTRA[@]}" --out "$OUT"
        ;;
    *)
        echo "unknown mode $MODE: use mirrored or jax" >&2
        exit 2
        ;;
esac
