"""Chooses how many of a run's last checkpoints to average, by validation loss.

Section 6.1 averages a fixed number of checkpoints (5 for base, 20 for big),
written 10 minutes apart late in a long run. A run stopped while the model
still improves quickly is better served by fewer; this scores the average of
the last K checkpoints on the validation pairs for each K and prints the K
with the lowest label-smoothed validation loss (the test set is not used).

Usage:

    python tools/choose_average.py runs/multi30k_en_de \
        --valid-src val.en.gz --valid-tgt val.de.gz --candidates 1 3 5 10
"""

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--valid-src", required=True)
    parser.add_argument("--valid-tgt", required=True)
    parser.add_argument("--candidates", type=int, nargs="+", default=[1, 3, 5, 10])
    args = parser.parse_args()

    from keras_transformer import TransformerTokenizer
    from keras_transformer.training import checkpoints, data
    from keras_transformer.training_run import VOCABULARY_FILE, TrainingRun, build_model, read_run_file
    from keras_transformer.utils.files import read_lines

    run = read_run_file(args.run_dir)
    run_args = argparse.Namespace(**run["arguments"])
    tokenizer = TransformerTokenizer(proto=os.path.join(args.run_dir, VOCABULARY_FILE))
    model = build_model(run["backbone"], tokenizer, run_args.max_length)
    trainer = TrainingRun.from_folder(args.run_dir).trainer()
    trainer.compile(model)
    sources = list(read_lines(args.valid_src))
    targets = list(read_lines(args.valid_tgt))
    pairs = data.tokenize_pairs(sources, targets, tokenizer, run_args.max_length)
    batches = data.token_batches(pairs, run_args.tokens_per_batch, shuffle=False)
    paths = checkpoints.list_checkpoints(trainer.checkpoint_directory)
    losses = {}
    for k in sorted(set(args.candidates)):
        if k > len(paths):
            print(f"last {k}: skipped, the run has only {len(paths)} checkpoints")
            continue
        model.set_weights(checkpoints.average_checkpoints(paths[-k:]))
        losses[k] = trainer.evaluate(model, batches)["loss"]
        print(
            f"last {k:2d} ({os.path.basename(paths[-k])} .. {os.path.basename(paths[-1])}): "
            f"validation loss {losses[k]:.4f}"
        )
    print(f"best: LAST={min(losses, key=losses.get)}")


if __name__ == "__main__":
    main()
