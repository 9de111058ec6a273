"""The files of a `keras-transformer train` run folder, its model and its trainer."""

RUN_FILE = "run.json"  # architecture and command-line options
VOCABULARY_FILE = "vocabulary.spm"
CHECKPOINT_DIR = "checkpoints"


def build_model(backbone_config: dict, tokenizer, max_length: int):
    """A `Transformer` with a preprocessor, so that it saves as a full preset."""
    from keras_transformer.models.transformer import Transformer
    from keras_transformer.models.transformer_backbone import TransformerBackbone
    from keras_transformer.models.transformer_preprocessor import TransformerPreprocessor

    return Transformer(
        backbone=TransformerBackbone(**backbone_config),
        preprocessor=TransformerPreprocessor(tokenizer, max_length, max_length),
    )


def run_trainer(directory: str, arguments: dict, *, chief: bool = True):
    """The `Trainer` of a run folder, from its `keras-transformer train` options.

    Args:
        directory: the run folder.
        arguments: the command's options by name (run.json's `arguments`).
        chief: whether this process writes the run folder.
    """
    from keras_transformer.training.recipe import TrainingRecipe
    from keras_transformer.training.trainer import Trainer

    recipe = TrainingRecipe(
        warmup_steps=arguments["warmup_steps"],
        peak_learning_rate=arguments["peak_lr"],
        label_smoothing=arguments["label_smoothing"],
        accumulate=arguments["accumulate"],
    )
    return Trainer(
        directory,
        recipe,
        max_steps=arguments["max_steps"],
        valid_every=arguments["valid_every"],
        strategy=arguments["strategy"],
        dtype=arguments["dtype"],
        checkpoint_every_steps=arguments["checkpoint_every_steps"],
        checkpoint_every_minutes=arguments["checkpoint_every_minutes"] or None,
        keep_checkpoints=arguments["keep_checkpoints"],
        valid_bleu_sentences=arguments["valid_bleu_sentences"],
        log_every=arguments["log_every"],
        chief=chief,
        verbose=arguments["verbose"],
    )
