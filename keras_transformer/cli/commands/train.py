"""Train a Transformer on parallel text, with the paper's recipe by default.

The run folder (--out) receives the vocabulary (trained from the training
data unless --vocabulary is given), data/ (the training text tokenized once,
as keras-transformer prepare does, which a resumed run reads without
tokenizing again), run.json (architecture and options),
checkpoints/ (every --checkpoint-every-steps steps and/or
--checkpoint-every-minutes minutes), logs/ (TensorBoard), curves.csv and
training_curves.png. Running the same command again resumes from the last
checkpoint with the same step, optimizer state and learning rate.
With --data instead of --src/--tgt, the training pairs are streamed from a
corpus that `keras-transformer prepare` tokenized once (with its vocabulary),
so memory does not grow with the corpus and a resumed run starts at once.

Example, Multi30k's Transformer-Tiny recipe:

    keras-transformer train --src train.en.gz --tgt train.de.gz \\
        --valid-src val.en.gz --valid-tgt val.de.gz --preset transformer_tiny \\
        --vocab-size 10000 --tokens-per-batch 4000 --max-steps 8000 \\
        --warmup-steps 2000 --peak-lr 0.005 --out runs/multi30k_en_de
"""

import argparse
import json
import warnings

from keras_transformer.presets.catalog import ARCHITECTURES
from keras_transformer.training_run import DEFAULT_OPTIONS, TrainingRun, backbone_arguments
from keras_transformer.utils.errors import UserError

ARCHITECTURE_FLAGS = {
    "hidden_dim": "hidden_dim",
    "ff_dim": "intermediate_dim",
    "heads": "num_heads",
    "dropout": "dropout",
    "attention_dropout": "attention_dropout",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("data")
    data.add_argument("--src", help="source sentences, one a line (plain or .gz); a TSV file without --tgt")
    data.add_argument("--tgt", help="target sentences, line-aligned with --src")
    data.add_argument(
        "--data",
        help="instead of --src/--tgt: a folder from keras-transformer prepare, streamed from disk, with its vocabulary",
    )
    data.add_argument("--valid-src", help="validation source sentences (or a TSV file without --valid-tgt)")
    data.add_argument("--valid-tgt", help="validation target sentences")
    data.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip and count empty or undecodable lines and unpaired lines, instead of stopping",
    )
    data.add_argument(
        "--vocabulary", help="an existing SentencePiece .spm vocabulary; default: train one on the training data"
    )
    data.add_argument(
        "--vocab-size",
        type=int,
        default=DEFAULT_OPTIONS["vocab_size"],
        help="size of the shared vocabulary to train (paper, English-German: 37000)",
    )
    data.add_argument(
        "--max-length",
        type=int,
        default=DEFAULT_OPTIONS["max_length"],
        help="longest sequence in tokens; longer pairs are dropped and counted (default %(default)s)",
    )
    data.add_argument(
        "--tokens-per-batch",
        type=int,
        default=DEFAULT_OPTIONS["tokens_per_batch"],
        help="about this many source and as many target tokens per batch "
        "(paper: 25000; with --accumulate, per micro-batch)",
    )

    model = parser.add_argument_group("model (flags override --preset and --config)")
    model.add_argument("--preset", help=f"architecture: {', '.join(ARCHITECTURES)} or a KerasHub preset")
    model.add_argument("--config", help="a JSON file of TransformerBackbone arguments")
    model.add_argument("--layers", type=int, help="encoder and decoder layers (N)")
    model.add_argument("--hidden-dim", type=int, help="d_model")
    model.add_argument("--ff-dim", type=int, help="d_ff")
    model.add_argument("--heads", type=int, help="attention heads (h)")
    model.add_argument("--dropout", type=float, help="P_drop")
    model.add_argument(
        "--attention-dropout", type=float, help="dropout on attention weights (default 0, as in the paper)"
    )

    recipe = parser.add_argument_group("training")
    recipe.add_argument(
        "--max-steps", type=int, default=DEFAULT_OPTIONS["max_steps"], help="optimizer updates (paper: 100000 base)"
    )
    recipe.add_argument(
        "--warmup-steps", type=int, default=DEFAULT_OPTIONS["warmup_steps"], help="linear warmup (paper: %(default)s)"
    )
    recipe.add_argument(
        "--peak-lr", type=float, help="the highest learning rate; default: the paper's d_model^-0.5 * warmup^-0.5"
    )
    recipe.add_argument(
        "--label-smoothing", type=float, default=DEFAULT_OPTIONS["label_smoothing"], help="eps_ls (paper: %(default)s)"
    )
    recipe.add_argument(
        "--accumulate",
        type=int,
        default=DEFAULT_OPTIONS["accumulate"],
        help="micro-batches per update (gradient accumulation)",
    )
    recipe.add_argument(
        "--dtype", choices=("float32", "mixed_bfloat16", "mixed_float16"), default=DEFAULT_OPTIONS["dtype"]
    )
    recipe.add_argument(
        "--strategy", choices=("none", "mirrored", "jax-data-parallel"), default=DEFAULT_OPTIONS["strategy"]
    )
    recipe.add_argument("--seed", type=int, default=DEFAULT_OPTIONS["seed"])
    recipe.add_argument(
        "--coordinator", help="multi-host JAX: host:port of process 0 (with --strategy jax-data-parallel)"
    )
    recipe.add_argument(
        "--num-processes",
        type=int,
        default=DEFAULT_OPTIONS["num_processes"],
        help="multi-host JAX: number of processes",
    )
    recipe.add_argument(
        "--process-id",
        type=int,
        default=DEFAULT_OPTIONS["process_id"],
        help="multi-host JAX: this process (0 writes the run folder)",
    )
    recipe.add_argument("--checkpoint-every-steps", type=int, help="save every this many updates")
    recipe.add_argument(
        "--checkpoint-every-minutes",
        type=float,
        default=DEFAULT_OPTIONS["checkpoint_every_minutes"],
        help="save every this many minutes (paper: %(default)s; 0 turns it off)",
    )
    recipe.add_argument(
        "--valid-bleu-sentences",
        type=int,
        default=DEFAULT_OPTIONS["valid_bleu_sentences"],
        help="validation pairs translated (greedy) for the BLEU curve at each validation; 0 turns it off",
    )
    recipe.add_argument("--keep-checkpoints", type=int, help="keep only the newest this many checkpoints")
    recipe.add_argument(
        "--valid-every",
        type=int,
        default=DEFAULT_OPTIONS["valid_every"],
        help="updates between validations and curve points",
    )
    recipe.add_argument(
        "--log-every", type=int, default=DEFAULT_OPTIONS["log_every"], help="updates between TensorBoard scalars"
    )
    recipe.add_argument("--out", required=True, help="the run folder; an existing run there is resumed")
    recipe.add_argument(
        "--verbose",
        type=int,
        default=DEFAULT_OPTIONS["verbose"],
        choices=(0, 1, 2),
        help="Keras verbosity: 0 silent, 1 progress bar, 2 one line per validation",
    )


def resolve_architecture(args: argparse.Namespace) -> dict:
    """Backbone arguments from --preset, then --config, then explicit flags."""
    config = {}
    if args.preset:
        config.update(_preset_architecture(args.preset, args))
    if args.config:
        with open(args.config) as f:
            config.update(json.load(f))
    if args.layers is not None:  # both stacks, whatever the preset or config says
        config["num_encoder_layers"] = config["num_decoder_layers"] = args.layers
    for flag, key in ARCHITECTURE_FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            config[key] = value
    return backbone_arguments(config)


def _preset_architecture(preset: str, args) -> dict:
    if preset in ARCHITECTURES:
        return dict(ARCHITECTURES[preset])
    if all(getattr(args, flag) is not None for flag in ("layers", "hidden_dim", "ff_dim", "heads")):
        return {}  # The flags say everything; don't depend on the preset loading.
    from keras_transformer import Transformer

    try:
        with warnings.catch_warnings():
            # Only the architecture is used; a missing vocabulary doesn't matter.
            warnings.simplefilter("ignore")
            return Transformer.from_preset(preset, load_weights=False).backbone.get_config()
    except Exception as error:
        raise UserError(
            f"cannot load the architecture of preset {preset!r} ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); name one of "
            f"{', '.join(ARCHITECTURES)} or give --layers --hidden-dim --ff-dim --heads."
        ) from None


def run(args: argparse.Namespace) -> int:
    if (args.src is None) == (args.data is None):
        raise UserError("give the training data either as --src (and --tgt) or as --data (a prepared corpus).")
    options = {key: getattr(args, key) for key in DEFAULT_OPTIONS}
    TrainingRun(args.out, lambda: resolve_architecture(args), **options).train()
    return 0
