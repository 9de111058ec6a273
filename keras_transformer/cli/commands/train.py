"""Train a Transformer on parallel text, with the paper's recipe by default.

The run folder (--out) receives the vocabulary (trained from the training
data unless --vocabulary is given), run.json (architecture and options),
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
import os
import warnings

from keras_transformer.presets.catalog import ARCHITECTURES
from keras_transformer.training.recipe import TrainingRecipe
from keras_transformer.training.run_folder import RUN_FILE, VOCABULARY_FILE, build_model
from keras_transformer.training.trainer import CHECKPOINT_MINUTES

ARCHITECTURE_FLAGS = {
    "layers": "num_layers",
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
        default=37000,
        help="size of the shared vocabulary to train (paper, English-German: 37000)",
    )
    data.add_argument(
        "--max-length",
        type=int,
        default=256,
        help="longest sequence in tokens; longer pairs are dropped and counted (default 256)",
    )
    data.add_argument(
        "--tokens-per-batch",
        type=int,
        default=25000,
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
    recipe.add_argument("--max-steps", type=int, default=100_000, help="optimizer updates (paper: 100000 base)")
    recipe.add_argument(
        "--warmup-steps", type=int, default=TrainingRecipe.warmup_steps, help="linear warmup (paper: %(default)s)"
    )
    recipe.add_argument(
        "--peak-lr", type=float, help="the highest learning rate; default: the paper's d_model^-0.5 * warmup^-0.5"
    )
    recipe.add_argument(
        "--label-smoothing", type=float, default=TrainingRecipe.label_smoothing, help="eps_ls (paper: %(default)s)"
    )
    recipe.add_argument("--accumulate", type=int, default=1, help="micro-batches per update (gradient accumulation)")
    recipe.add_argument("--dtype", choices=("float32", "mixed_bfloat16", "mixed_float16"), default="float32")
    recipe.add_argument("--strategy", choices=("none", "mirrored", "jax-data-parallel"), default="none")
    recipe.add_argument("--seed", type=int, default=1)
    recipe.add_argument(
        "--coordinator", help="multi-host JAX: host:port of process 0 (with --strategy jax-data-parallel)"
    )
    recipe.add_argument("--num-processes", type=int, default=1, help="multi-host JAX: number of processes")
    recipe.add_argument(
        "--process-id", type=int, default=0, help="multi-host JAX: this process (0 writes the run folder)"
    )
    recipe.add_argument("--checkpoint-every-steps", type=int, help="save every this many updates")
    recipe.add_argument(
        "--checkpoint-every-minutes",
        type=float,
        default=CHECKPOINT_MINUTES,
        help="save every this many minutes (paper: %(default)s; 0 turns it off)",
    )
    recipe.add_argument(
        "--valid-bleu-sentences",
        type=int,
        default=200,
        help="validation pairs translated (greedy) for the BLEU curve at each validation; 0 turns it off",
    )
    recipe.add_argument("--keep-checkpoints", type=int, help="keep only the newest this many checkpoints")
    recipe.add_argument("--valid-every", type=int, default=1000, help="updates between validations and curve points")
    recipe.add_argument("--log-every", type=int, default=100, help="updates between TensorBoard scalars")
    recipe.add_argument("--out", required=True, help="the run folder; an existing run there is resumed")
    recipe.add_argument(
        "--verbose",
        type=int,
        default=1,
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
    for flag, key in ARCHITECTURE_FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            config[key] = value
    if "num_layers" in config:
        layers = config.pop("num_layers")
        config.setdefault("num_encoder_layers", layers)
        config.setdefault("num_decoder_layers", layers)
    missing = [
        flag
        for flag, key in (
            ("--layers", "num_encoder_layers"),
            ("--hidden-dim", "hidden_dim"),
            ("--ff-dim", "intermediate_dim"),
            ("--heads", "num_heads"),
        )
        if key not in config
    ]
    if missing:
        from keras_transformer.utils.errors import UserError

        raise UserError(f"the model size is not given: use --preset, --config, or {' '.join(missing)}.")
    for key in ("vocabulary_size", "name", "trainable", "dtype"):
        config.pop(key, None)
    return config


def _preset_architecture(preset: str, args) -> dict:
    if preset in ARCHITECTURES:
        return dict(ARCHITECTURES[preset])
    if all(getattr(args, flag) is not None for flag in ("layers", "hidden_dim", "ff_dim", "heads")):
        return {}  # The flags say everything; don't depend on the preset loading.
    from keras_transformer import Transformer
    from keras_transformer.utils.errors import UserError

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


def _read(source, target, skip_bad, what):
    from keras_transformer.training.data import read_parallel

    sources, targets, report = read_parallel(source, target, skip_bad=skip_bad)
    print(f"{what}: {report}.")
    if not sources:
        raise ValueError(f"no usable sentence pairs in the {what} data ({source}).")
    return sources, targets


def run(args: argparse.Namespace) -> int:
    import keras

    from keras_transformer.training import data, distribution
    from keras_transformer.training.prepared import prepared_batches
    from keras_transformer.training.run_folder import run_trainer

    if args.coordinator:
        # Before anything touches a JAX device.
        distribution.initialize(args.coordinator, args.num_processes, args.process_id)
    chief = distribution.is_chief()  # the one process that writes the run folder
    # Before any tokenizer exists: tf.random.set_seed clears TF's eager
    # resources, which breaks the SentencePiece op afterwards.
    keras.utils.set_random_seed(args.seed)
    if args.accumulate < 1:
        raise ValueError(f"--accumulate must be at least 1; got {args.accumulate}.")
    trainer = run_trainer(args.out, vars(args), chief=chief)
    architecture = resolve_architecture(args)
    os.makedirs(args.out, exist_ok=True)
    run_file = os.path.join(args.out, RUN_FILE)
    if os.path.exists(run_file):
        with open(run_file) as f:
            previous = json.load(f)["backbone"]
        changed = {k: v for k, v in architecture.items() if previous.get(k, v) != v}
        if changed:
            raise ValueError(
                f"{args.out} holds a run with another architecture (now {changed}, "
                f"then {previous}); use a new --out folder."
            )

    if (args.src is None) == (args.data is None):
        raise ValueError("give the training data either as --src (and --tgt) or as --data (a prepared corpus).")
    valid = None
    if args.valid_src:
        valid = _read(args.valid_src, args.valid_tgt, args.skip_bad, "validation")
    if args.data:
        corpus, tokenizer = _prepared(args, write=chief)
    else:
        train_sources, train_targets = _read(args.src, args.tgt, args.skip_bad, "training")
        tokenizer = _vocabulary(args, train_sources + train_targets, write=chief)
        train_pairs = data.tokenize_pairs(train_sources, train_targets, tokenizer, args.max_length)
        source_tokens, target_tokens = train_pairs.num_tokens()
        print(
            f"training: {len(train_pairs)} pairs, {source_tokens} source and {target_tokens} target "
            f"tokens; {train_pairs.dropped} pairs longer than {args.max_length} tokens dropped."
        )
    valid_pairs = None
    if valid:
        valid_pairs = data.tokenize_pairs(*valid, tokenizer, args.max_length)
        print(f"validation: {len(valid_pairs)} pairs; {valid_pairs.dropped} too long, dropped.")

    backbone_config = {
        **architecture,
        "vocabulary_size": tokenizer.vocabulary_size(),
        "max_sequence_length": max(args.max_length, architecture.get("max_sequence_length", 0)),
    }
    if chief:
        with open(run_file + ".tmp", "w") as f:
            json.dump(
                {"backbone": backbone_config, "arguments": {k: v for k, v in vars(args).items() if k != "run"}},
                f,
                indent=2,
                default=str,
            )
        os.replace(run_file + ".tmp", run_file)

    with trainer.scope():
        model = build_model(backbone_config, tokenizer, args.max_length)
        trainer.compile(model)
        step = trainer.resume(model)
        if step >= args.max_steps:
            print(f"{args.out} has already reached step {step} (--max-steps {args.max_steps}).")
            return 0
        # Every batch splits evenly over the devices. A resumed run reshuffles
        # with a seed of its step. Every process of a multi-host run reads the
        # same batches and keeps its rows of each (distribution.prepare_dataset):
        # the processes' shares of a batch must have one shape.
        batches = dict(repeat=True, seed=args.seed + step, batch_multiple=trainer.replicas)
        if args.data:
            train_data = prepared_batches(corpus, args.tokens_per_batch, **batches)
        else:
            train_data = data.token_batches(train_pairs, args.tokens_per_batch, **batches)
        valid_data = None
        if valid_pairs:
            valid_data = data.token_batches(
                valid_pairs,
                args.tokens_per_batch,
                shuffle=False,
                batch_multiple=trainer.replicas,
                drop_remainder=trainer.replicas > 1,
            )
        result = trainer.fit(model, train_data, valid_data, step=step, valid_texts=valid)
    print(
        f"trained to step {result.step} at {result.tokens_per_second:.0f} target tokens/s; "
        f"last checkpoint {result.last_checkpoint}."
    )
    return 0


def _vocabulary(args, sentences, write=True):
    from keras_transformer import TransformerTokenizer, train_tokenizer

    path = os.path.join(args.out, VOCABULARY_FILE)
    if args.vocabulary:
        tokenizer = TransformerTokenizer(proto=args.vocabulary)
    elif os.path.exists(path):
        print(f"using the vocabulary of this run, {path}.")
        return TransformerTokenizer(proto=path)
    elif args.num_processes > 1:
        raise ValueError(
            "with several processes, give every one the same --vocabulary (train it with one "
            "process first, e.g. a run with --max-steps 0), so that all agree on it."
        )
    else:
        print(f"training a shared vocabulary of {args.vocab_size} subwords on the training data.")
        tokenizer = train_tokenizer(sentences, args.vocab_size)
    if write:
        _write_vocabulary(path, tokenizer)
    return tokenizer


def _prepared(args, write=True):
    """The prepared corpus of --data and its tokenizer, which the run folder's (and --vocabulary) must match."""
    from keras_transformer import TransformerTokenizer
    from keras_transformer.training.prepared import PreparedCorpus, tokenizer_checksum

    corpus = PreparedCorpus.open(args.data)
    print(f"training: {args.data}: {corpus}.")
    if corpus.max_length > args.max_length:
        raise ValueError(
            f"{args.data} was prepared with --max-length {corpus.max_length}: train with at least that "
            f"--max-length, or prepare the corpus again with --max-length {args.max_length}."
        )
    tokenizer = corpus.tokenizer()
    path = os.path.join(args.out, VOCABULARY_FILE)
    for given in (args.vocabulary, path if os.path.exists(path) else None):
        if given is not None and tokenizer_checksum(TransformerTokenizer(proto=given)) != corpus.tokenizer_sha256:
            raise ValueError(
                f"{given} is not the vocabulary {args.data} was tokenized with: leave out --vocabulary, "
                "or train in a new --out folder."
            )
    if write and not os.path.exists(path):
        _write_vocabulary(path, tokenizer)
    return corpus, tokenizer


def _write_vocabulary(path, tokenizer):
    with open(path + ".tmp", "wb") as f:
        f.write(tokenizer.proto)
    os.replace(path + ".tmp", path)
