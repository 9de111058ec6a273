"""Average the last checkpoints of a training run into a KerasHub preset.

Section 6.1: the base model averages its last 5 checkpoints, the big model
its last 20. The preset (config, weights, vocabulary) is written to a
temporary folder next to --out and renamed into place when complete, so an
interrupted run never leaves a half-written preset.

Example:

    keras-transformer average runs/ende --last 5 --out presets/my_ende
"""

import argparse
import json
import os


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="the --out folder of `keras-transformer train`")
    parser.add_argument(
        "--last", type=int, default=5, help="average this many newest checkpoints (paper: 5 base, 20 big)"
    )
    parser.add_argument("--out", required=True, help="the preset folder to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    parser.add_argument(
        "--weights-dtype",
        choices=("float32", "float16"),
        default="float32",
        help="store the weights in this dtype (float16 halves the files; they load as float32)",
    )


def run(args: argparse.Namespace) -> int:
    from keras_transformer.training import checkpoints
    from keras_transformer.training.run_folder import CHECKPOINT_DIR, RUN_FILE, VOCABULARY_FILE
    from keras_transformer.utils.errors import UserError

    if args.last < 1:
        raise UserError(f"--last must be at least 1; got {args.last}.")
    run_file = os.path.join(args.run_dir, RUN_FILE)
    if not os.path.exists(run_file):
        raise UserError(f"{args.run_dir} is not a training run folder (it has no {RUN_FILE}).")
    paths = checkpoints.list_checkpoints(os.path.join(args.run_dir, CHECKPOINT_DIR))
    if not paths:
        raise UserError(f"{args.run_dir} has no checkpoints yet.")
    if os.path.exists(args.out) and not args.overwrite:
        raise UserError(f"{args.out} exists; pass --overwrite to replace it.")
    if len(paths) < args.last:
        print(f"only {len(paths)} checkpoints in {args.run_dir}; averaging all of them.")
    paths = paths[-args.last :]
    with open(run_file) as f:
        run_config = json.load(f)
    weights = checkpoints.average_checkpoints(paths)
    model = _model(run_config, os.path.join(args.run_dir, VOCABULARY_FILE))
    model.set_weights(weights)
    weights_dtype = None if args.weights_dtype == "float32" else args.weights_dtype
    model.save_to_preset(args.out, weights_dtype=weights_dtype)  # atomic: a temporary folder, then a rename
    first, last = os.path.basename(paths[0]), os.path.basename(paths[-1])
    print(f"averaged {len(paths)} checkpoints ({first} .. {last}) into {args.out}.")
    return 0


def _model(run_config: dict, vocabulary: str):
    from keras_transformer import TransformerTokenizer
    from keras_transformer.training.run_folder import build_model

    max_length = run_config["arguments"]["max_length"]
    return build_model(run_config["backbone"], TransformerTokenizer(proto=vocabulary), max_length)
