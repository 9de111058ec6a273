"""The training recipe of section 5 (optimizer, schedule, loss, metrics, the
training step, callbacks, checkpoints) and the data it trains on: parallel text
batched by tokens, corpora tokenized once into shards. A training run built on
them is `keras_transformer.training_run`."""

from keras_transformer.training.losses import LabelSmoothedCrossEntropy
from keras_transformer.training.metrics import MaskedAccuracy, TargetTokens
from keras_transformer.training.optimizer import paper_optimizer, recipe_optimizer
from keras_transformer.training.recipe import TrainingRecipe
from keras_transformer.training.schedule import TransformerSchedule

__all__ = [
    "LabelSmoothedCrossEntropy",
    "MaskedAccuracy",
    "TargetTokens",
    "TrainingRecipe",
    "TransformerSchedule",
    "paper_optimizer",
    "recipe_optimizer",
]
