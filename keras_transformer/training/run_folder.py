"""The files of a `keras-transformer train` run folder, and its model."""

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
