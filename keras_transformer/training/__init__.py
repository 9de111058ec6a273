"""The training recipe of section 5: schedule, loss, metric."""

from keras_transformer.training.losses import LabelSmoothedCrossEntropy
from keras_transformer.training.metrics import MaskedAccuracy
from keras_transformer.training.schedule import TransformerSchedule

__all__ = ["LabelSmoothedCrossEntropy", "MaskedAccuracy", "TransformerSchedule"]
