"""Token metrics that ignore padding: accuracy, and the count of target tokens."""

import keras
from keras import ops


def label_scores_highest(y_true, y_pred):
    """1.0 where the label's score is the highest of its row, else 0.0.

    This is `argmax(y_pred) == y_true` except that a tie for the highest score
    counts as right. Keras' accuracy takes the argmax, which XLA computes on
    a CPU as an index-tracking reduction, slower than this max and one
    gather.
    """
    y_true = ops.cast(y_true, "int32")
    label_score = ops.squeeze(ops.take_along_axis(y_pred, y_true[..., None], axis=-1), -1)
    return ops.cast(label_score >= ops.max(y_pred, axis=-1), "float32")


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.MeanMetricWrapper):
    """The share of real (non-padding) target tokens predicted right.

    Like `keras.metrics.SparseCategoricalAccuracy` (labels `(batch, length)`,
    scores `(batch, length, vocabulary)`), but labels equal to
    `pad_token_id` get weight 0 even when no `sample_weight` is passed, and
    "predicted right" is `label_scores_highest`.

    Example:
    >>> import numpy as np
    >>> metric = MaskedAccuracy()
    >>> metric.update_state(np.array([[1, 2, 0, 0]]), np.eye(3)[[[1, 1, 2, 2]]])
    >>> float(metric.result())
    0.5
    """

    def __init__(self, pad_token_id: int = 0, name: str = "accuracy", dtype=None):
        super().__init__(fn=label_scores_highest, name=name, dtype=dtype)
        self.pad_token_id = pad_token_id

    def update_state(self, y_true, y_pred, sample_weight=None):
        weight = ops.cast(ops.not_equal(y_true, self.pad_token_id), self.dtype)
        if sample_weight is not None:
            weight = weight * ops.cast(sample_weight, self.dtype)
        return super().update_state(y_true, y_pred, sample_weight=weight)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype, "pad_token_id": self.pad_token_id}


@keras.saving.register_keras_serializable(package="keras_transformer")
class TargetTokens(keras.metrics.Metric):
    """Counts the real (non-padding) target tokens seen since the last reset.

    `TrainingMonitor` turns its value into tokens per second. Counting in the
    training step (rather than in the input pipeline) counts what every
    replica actually trained on.
    """

    def __init__(self, pad_token_id: int = 0, name: str = "target_tokens", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_token_id = pad_token_id
        self.count = self.add_variable(shape=(), initializer="zeros", name="count", dtype="float32")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.count.assign_add(ops.sum(ops.cast(ops.not_equal(y_true, self.pad_token_id), "float32")))

    def result(self):
        # A tensor, not the variable itself (JAX cannot trace a variable out).
        return ops.cast(self.count, "float32")

    def reset_state(self):
        self.count.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "pad_token_id": self.pad_token_id}
