"""A training run: what `keras-transformer train` does, built on the recipe of
`keras_transformer.training`. It owns a run folder (vocabulary, `run.json`,
prepared data, checkpoints, logs), trains into it and resumes from it, and
averages its last checkpoints into a preset."""

from keras_transformer.training_run.folder import (
    RUN_FILE,
    VOCABULARY_FILE,
    average_into_preset,
    build_model,
    read_run_file,
)
from keras_transformer.training_run.run import DEFAULT_OPTIONS, TrainingRun, backbone_arguments
from keras_transformer.training_run.trainer import Trainer, TrainingResult

__all__ = [
    "DEFAULT_OPTIONS",
    "RUN_FILE",
    "VOCABULARY_FILE",
    "Trainer",
    "TrainingResult",
    "TrainingRun",
    "average_into_preset",
    "backbone_arguments",
    "build_model",
    "read_run_file",
]
