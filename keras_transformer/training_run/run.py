"""A training run as one object: what `keras-transformer train` does, callable from Python.

`TrainingRun` owns the run folder: its vocabulary (trained on the training
data unless one is given), `run.json` (architecture and options, checked
against the folder's earlier run so that a resumed run keeps its
architecture), the `Trainer` built from the options, and resuming from the
last checkpoint. The training data are a corpus `keras-transformer prepare`
tokenized (`data`), or text files (`src`/`tgt`), which the run prepares
likewise into its folder (`data/`) once, after the vocabulary (several
processes each read them into memory instead).

Example, Multi30k's Transformer-Tiny recipe:

    from keras_transformer.training_run import TrainingRun

    run = TrainingRun("runs/en_de", "transformer_tiny", src="train.en.gz", tgt="train.de.gz", max_steps=8000)
    run.train()
"""

import json
import os
from collections.abc import Callable, Iterable, Iterator

from keras_transformer.presets.catalog import ARCHITECTURES
from keras_transformer.training.recipe import TrainingRecipe
from keras_transformer.training_run.folder import DATA_FOLDER, RUN_FILE, VOCABULARY_FILE, build_model, read_run_file
from keras_transformer.training_run.trainer import CHECKPOINT_MINUTES, Trainer, TrainingResult
from keras_transformer.utils.errors import UserError
from keras_transformer.utils.files import file_replaced_atomically

# The options of a run, as run.json's `arguments` records them, and their defaults.
DEFAULT_OPTIONS = {
    "src": None,  # source sentences, one a line (plain or .gz); a TSV file without `tgt`
    "tgt": None,
    "data": None,  # instead of src/tgt: a folder from `keras-transformer prepare`
    "valid_src": None,
    "valid_tgt": None,
    "skip_bad": False,  # skip and count unusable lines instead of stopping
    "vocabulary": None,  # an existing SentencePiece .spm file; None: train one
    "vocab_size": 37000,  # the paper's English-German shared vocabulary
    "max_length": 256,  # longest sequence in tokens; longer pairs are dropped
    "tokens_per_batch": 25000,  # section 5.1
    "max_steps": 100_000,  # section 5.2, base model
    "warmup_steps": TrainingRecipe.warmup_steps,
    "peak_lr": None,  # None: the paper's d_model^-0.5 * warmup^-0.5
    "label_smoothing": TrainingRecipe.label_smoothing,
    "accumulate": 1,
    "dtype": "float32",
    "strategy": "none",
    "seed": 1,
    "coordinator": None,
    "num_processes": 1,
    "process_id": 0,
    "checkpoint_every_steps": None,
    "checkpoint_every_minutes": CHECKPOINT_MINUTES,
    "valid_bleu_sentences": 200,
    "keep_checkpoints": None,
    "valid_every": 1000,
    "log_every": 100,
    "verbose": 1,
}

# What an architecture must give, by backbone argument.
REQUIRED_ARCHITECTURE = ("num_encoder_layers", "hidden_dim", "intermediate_dim", "num_heads")


def backbone_arguments(architecture: dict | str) -> dict:
    """`TransformerBackbone` arguments of an architecture (or of a name in
    `presets.catalog.ARCHITECTURES`); `num_layers` sets both stacks.

    The vocabulary size and the name are the run's, not the architecture's.
    """
    if isinstance(architecture, str):
        if architecture not in ARCHITECTURES:
            raise UserError(f"no architecture {architecture!r}; name one of {', '.join(ARCHITECTURES)}.")
        architecture = ARCHITECTURES[architecture]
    config = dict(architecture)
    if "num_layers" in config:
        layers = config.pop("num_layers")
        config.setdefault("num_encoder_layers", layers)
        config.setdefault("num_decoder_layers", layers)
    missing = [key for key in REQUIRED_ARCHITECTURE if key not in config]
    if missing:
        raise UserError(f"the model size is not given: {', '.join(missing)} missing.")
    for key in ("vocabulary_size", "name", "trainable", "dtype"):
        config.pop(key, None)
    return config


class TrainingRun:
    """Trains a `Transformer` into a run folder, resuming the run already there.

    Args:
        directory: the run folder.
        architecture: `TransformerBackbone` arguments (`num_layers` sets both
            stacks), a name in `presets.catalog.ARCHITECTURES`, or a function
            returning them, called once the process is set up (loading a
            preset's architecture builds a model, which a multi-host JAX run
            must not do before it starts).
        **options: the keys of `DEFAULT_OPTIONS`, which fill in the others.
    """

    def __init__(self, directory: str, architecture: dict | str | Callable[[], dict], **options):
        unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
        if unknown:
            raise TypeError(f"unknown training options: {', '.join(unknown)}.")
        self.directory = directory
        self._architecture = architecture
        self.architecture = None if callable(architecture) else backbone_arguments(architecture)
        self.options = {**DEFAULT_OPTIONS, **options}

    @classmethod
    def from_folder(cls, directory: str, **options) -> "TrainingRun":
        """The run recorded in a run folder's run.json, `options` overriding its own."""
        run = read_run_file(directory)
        recorded = {k: v for k, v in run["arguments"].items() if k in DEFAULT_OPTIONS}
        return cls(directory, run["backbone"], **{**recorded, **options})

    def trainer(self, *, chief: bool = True) -> Trainer:
        """The `Trainer` of this run's options; `chief`: whether this process writes the run folder."""
        options = self.options
        recipe = TrainingRecipe(
            warmup_steps=options["warmup_steps"],
            peak_learning_rate=options["peak_lr"],
            label_smoothing=options["label_smoothing"],
            accumulate=options["accumulate"],
        )
        return Trainer(
            self.directory,
            recipe,
            max_steps=options["max_steps"],
            valid_every=options["valid_every"],
            strategy=options["strategy"],
            dtype=options["dtype"],
            checkpoint_every_steps=options["checkpoint_every_steps"],
            checkpoint_every_minutes=options["checkpoint_every_minutes"] or None,
            keep_checkpoints=options["keep_checkpoints"],
            valid_bleu_sentences=options["valid_bleu_sentences"],
            log_every=options["log_every"],
            chief=chief,
            verbose=options["verbose"],
        )

    def train(self) -> TrainingResult | None:
        """Trains to `max_steps`; `None` when the run had already reached it."""
        import keras

        from keras_transformer.training import data, distribution
        from keras_transformer.training.shards_reading import prepared_batches

        options = self.options
        if options["coordinator"]:
            # Before anything touches a JAX device.
            distribution.initialize(options["coordinator"], options["num_processes"], options["process_id"])
        chief = distribution.is_chief()  # the one process that writes the run folder
        # Before any tokenizer exists: tf.random.set_seed clears TF's eager
        # resources, which breaks the SentencePiece op afterwards.
        keras.utils.set_random_seed(options["seed"])
        if options["accumulate"] < 1:
            raise ValueError(f"accumulate must be at least 1; got {options['accumulate']}.")
        trainer = self.trainer(chief=chief)
        if self.architecture is None:
            self.architecture = backbone_arguments(self._architecture())
        os.makedirs(self.directory, exist_ok=True)
        self._check_architecture()
        if (options["src"] is None) == (options["data"] is None):
            raise ValueError("give the training data either as src files or as data, a prepared corpus.")
        valid = None
        if options["valid_src"]:
            valid = _read(options["valid_src"], options["valid_tgt"], options["skip_bad"], "validation")
        max_length = options["max_length"]
        corpus = None
        if options["data"]:
            corpus, tokenizer = self._prepared(options["data"], write=chief)
        elif distribution.processes(options["strategy"])[0] == 1:
            corpus, tokenizer = self._prepared(self._prepare_text())
        else:
            # Several processes each read and tokenize the text, with the vocabulary
            # every one is given, rather than wait for one to prepare it.
            train_sources, train_targets = _read(options["src"], options["tgt"], options["skip_bad"], "training")
            tokenizer = self._vocabulary(lambda: train_sources + train_targets, write=chief)
            train_pairs = data.tokenize_pairs(train_sources, train_targets, tokenizer, max_length)
            source_tokens, target_tokens = train_pairs.num_tokens()
            print(
                f"training: {len(train_pairs)} pairs, {source_tokens} source and {target_tokens} target "
                f"tokens; {train_pairs.dropped} pairs longer than {max_length} tokens dropped."
            )
        valid_pairs = None
        if valid:
            valid_pairs = data.tokenize_pairs(*valid, tokenizer, max_length)
            print(f"validation: {len(valid_pairs)} pairs; {valid_pairs.dropped} too long, dropped.")
        backbone_config = {
            **self.architecture,
            "vocabulary_size": tokenizer.vocabulary_size(),
            "max_sequence_length": max(max_length, self.architecture.get("max_sequence_length", 0)),
        }
        if chief:
            self._write_run_file(backbone_config)

        with trainer.scope():
            model = build_model(backbone_config, tokenizer, max_length)
            trainer.compile(model)
            step = trainer.resume(model)
            if step >= options["max_steps"]:
                print(f"{self.directory} has already reached step {step} (max_steps {options['max_steps']}).")
                return None
            # Every batch splits evenly over the devices. A resumed run reshuffles
            # with a seed of its step. From a prepared corpus, each process of a
            # multi-host run reads its own share of the pairs and batches its
            # share of the tokens (distribution.prepare_dataset); with text in memory, every
            # process reads the same batches and keeps its rows of each. A corpus
            # of one shard (up to 100,000 pairs) streams in the order that
            # token_batches gives the same pairs in memory.
            batches = dict(repeat=True, seed=options["seed"] + step, batch_multiple=trainer.replicas)
            if step:
                print(f"the training data is reshuffled from here, with seed {batches['seed']} (--seed plus the step).")
            processes, process = distribution.processes(options["strategy"])
            if corpus is not None:
                batches.update(batch_multiple=trainer.replicas // processes, num_processes=processes)
                tokens = options["tokens_per_batch"] // processes
                train_data = prepared_batches(corpus, tokens, process_index=process, **batches)
            else:
                train_data = data.token_batches(train_pairs, options["tokens_per_batch"], **batches)
            valid_data = None
            if valid_pairs:
                valid_data = data.token_batches(
                    valid_pairs,
                    options["tokens_per_batch"],
                    shuffle=False,
                    batch_multiple=trainer.replicas,
                    drop_remainder=trainer.replicas > 1,
                )
            result = trainer.fit(
                model, train_data, valid_data, step=step, valid_texts=valid, per_process=corpus is not None
            )
        print(
            f"trained to step {result.step} at {result.tokens_per_second:.0f} target tokens/s; "
            f"last checkpoint {result.last_checkpoint}."
        )
        return result

    def _check_architecture(self) -> None:
        """A run folder holds one architecture: resuming with another is a mistake."""
        run_file = os.path.join(self.directory, RUN_FILE)
        if not os.path.exists(run_file):
            return
        with open(run_file) as f:
            previous = json.load(f)["backbone"]
        changed = {k: v for k, v in self.architecture.items() if previous.get(k, v) != v}
        if changed:
            raise ValueError(
                f"{self.directory} holds a run with another architecture (now {changed}, "
                f"then {previous}); use a new run folder."
            )

    def _write_run_file(self, backbone_config: dict) -> None:
        run_file = os.path.join(self.directory, RUN_FILE)
        with file_replaced_atomically(run_file) as f:
            json.dump({"backbone": backbone_config, "arguments": self.options}, f, indent=2, default=str)

    def _vocabulary(self, sentences: Callable[[], Iterable[str]], write: bool = True):
        """The given vocabulary, the run folder's, or one trained on the `sentences()`."""
        from keras_transformer.models.transformer_tokenizer import TransformerTokenizer, train_tokenizer

        options = self.options
        path = os.path.join(self.directory, VOCABULARY_FILE)
        if options["vocabulary"]:
            tokenizer = TransformerTokenizer(proto=options["vocabulary"])
        elif os.path.exists(path):
            print(f"using the vocabulary of this run, {path}.")
            return TransformerTokenizer(proto=path)
        elif options["num_processes"] > 1:
            raise ValueError(
                "with several processes, give every one the same vocabulary (train it with one "
                "process first, e.g. a run with max_steps 0), so that all agree on it."
            )
        else:
            print(f"training a shared vocabulary of {options['vocab_size']} subwords on the training data.")
            tokenizer = train_tokenizer(sentences(), options["vocab_size"])
        if write:
            _write_vocabulary(path, tokenizer)
        return tokenizer

    def _prepare_text(self) -> str:
        """The run folder's corpus prepared from `src`/`tgt`, prepared first (after the vocabulary) if absent.

        A resumed run reads it, tokenizing nothing again.
        """
        from keras_transformer.training.shards_reading import MANIFEST_FILE, PreparedCorpus
        from keras_transformer.training.shards_writing import prepare_corpus

        options = self.options
        folder = os.path.join(self.directory, DATA_FOLDER)
        inputs = [str(path) for path in (options["src"], options["tgt"]) if path is not None]
        if os.path.exists(os.path.join(folder, MANIFEST_FILE)):
            corpus = PreparedCorpus.open(folder)
            if (corpus.inputs, corpus.max_length) != (inputs, options["max_length"]):
                raise ValueError(
                    f"{folder} holds {', '.join(corpus.inputs)} prepared with max_length {corpus.max_length}, "
                    f"not {', '.join(inputs)} with max_length {options['max_length']}: train in a new run folder."
                )
            print(f"using the training data this run prepared, {folder}.")
            return folder
        tokenizer = self._vocabulary(lambda: _sentences(options["src"], options["tgt"], options["skip_bad"]))
        print(f"preparing the training data into {folder}, once: a resumed run reads it.")
        prepare_corpus(
            options["src"], options["tgt"], folder, tokenizer, options["max_length"], skip_bad=options["skip_bad"]
        )
        return folder

    def _prepared(self, folder: str, write: bool = True):
        """A prepared corpus and its tokenizer, which the run folder's (and `vocabulary`) must match."""
        from keras_transformer.models.transformer_tokenizer import TransformerTokenizer
        from keras_transformer.training.shards_reading import PreparedCorpus, tokenizer_checksum

        options = self.options
        corpus = PreparedCorpus.open(folder)
        print(f"training: {folder}: {corpus}.")
        if not corpus.pairs:
            raise ValueError(f"no usable sentence pairs in the training data ({', '.join(corpus.inputs)}).")
        if corpus.max_length > options["max_length"]:
            raise ValueError(
                f"{folder} was prepared with max_length {corpus.max_length}: train with at least that "
                f"max_length, or prepare the corpus again with max_length {options['max_length']}."
            )
        tokenizer = corpus.tokenizer()
        path = os.path.join(self.directory, VOCABULARY_FILE)
        for given in (options["vocabulary"], path if os.path.exists(path) else None):
            if given is not None and tokenizer_checksum(TransformerTokenizer(proto=given)) != corpus.tokenizer_sha256:
                raise ValueError(
                    f"{given} is not the vocabulary {folder} was tokenized with: leave out the "
                    "vocabulary, or train in a new run folder."
                )
        if write and not os.path.exists(path):
            _write_vocabulary(path, tokenizer)
        return corpus, tokenizer


def _read(source: str, target: str | None, skip_bad: bool, what: str) -> tuple[list[str], list[str]]:
    from keras_transformer.training.parallel_text import read_parallel

    sources, targets, report = read_parallel(source, target, skip_bad=skip_bad)
    print(f"{what}: {report}.")
    if not sources:
        raise ValueError(f"no usable sentence pairs in the {what} data ({source}).")
    return sources, targets


def _sentences(source: str, target: str | None, skip_bad: bool) -> Iterator[str]:
    """Every source sentence, then every target sentence, streamed: the order a
    vocabulary is trained on from sentences in memory, so it comes out the same."""
    from keras_transformer.training.parallel_text import ReadReport, stream_parallel

    for side in (0, 1):
        yield from (pair[side] for pair in stream_parallel(source, target, ReadReport(), skip_bad=skip_bad))


def _write_vocabulary(path: str, tokenizer) -> None:
    with file_replaced_atomically(path, "wb") as f:
        f.write(tokenizer.proto)
