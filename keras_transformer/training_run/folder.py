"""The files of a `keras-transformer train` run folder and the model it trains."""

import json
import os

RUN_FILE = "run.json"  # architecture and command-line options
VOCABULARY_FILE = "vocabulary.spm"
DATA_FOLDER = "data"  # the training text, prepared once (train --src/--tgt)
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


def read_run_file(directory: str) -> dict:
    """The run folder's run.json: `{"backbone": backbone arguments, "arguments": options}`."""
    with open(os.path.join(directory, RUN_FILE)) as f:
        return json.load(f)


def average_into_preset(directory: str, out: str, last: int, weights_dtype: str | None = None) -> list[str]:
    """Writes the mean of the run's newest `last` checkpoints as a preset (section 6.1); returns their paths.

    The preset is written to a temporary folder and renamed into place, so an
    interrupted average leaves no half-written preset.
    """
    from keras_transformer.models.transformer_tokenizer import TransformerTokenizer
    from keras_transformer.training import checkpoints
    from keras_transformer.utils.errors import UserError

    if last < 1:
        raise UserError(f"the number of checkpoints to average must be at least 1; got {last}.")
    if not os.path.exists(os.path.join(directory, RUN_FILE)):
        raise UserError(f"{directory} is not a training run folder (it has no {RUN_FILE}).")
    paths = checkpoints.list_checkpoints(os.path.join(directory, CHECKPOINT_DIR))
    if not paths:
        raise UserError(f"{directory} has no checkpoints yet.")
    if len(paths) < last:
        print(f"only {len(paths)} checkpoints in {directory}; averaging all of them.")
    paths = paths[-last:]
    run = read_run_file(directory)
    tokenizer = TransformerTokenizer(proto=os.path.join(directory, VOCABULARY_FILE))
    model = build_model(run["backbone"], tokenizer, run["arguments"]["max_length"])
    model.set_weights(checkpoints.average_checkpoints(paths))
    model.save_to_preset(out, weights_dtype=weights_dtype)
    return paths
