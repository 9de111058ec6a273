"""Average the last checkpoints of a training run into a KerasHub preset.

Section 6.1: the base model averages its last 5 checkpoints, the big model
its last 20. The preset (config, weights, vocabulary) is written to a
temporary folder next to --out and renamed into place when complete, so an
interrupted run never leaves a half-written preset.

Example:

    keras-transformer average runs/ende --last 5 --out presets/my_ende
"""

import argparse
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
    from keras_transformer.training_run import average_into_preset
    from keras_transformer.utils.errors import UserError

    if args.last < 1:
        raise UserError(f"--last must be at least 1; got {args.last}.")
    if os.path.exists(args.out) and not args.overwrite:
        raise UserError(f"{args.out} exists; pass --overwrite to replace it.")
    weights_dtype = None if args.weights_dtype == "float32" else args.weights_dtype
    paths = average_into_preset(args.run_dir, args.out, args.last, weights_dtype)
    first, last = os.path.basename(paths[0]), os.path.basename(paths[-1])
    print(f"averaged {len(paths)} checkpoints ({first} .. {last}) into {args.out}.")
    return 0
