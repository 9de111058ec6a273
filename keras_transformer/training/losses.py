"""Label-smoothed cross entropy over target tokens (section 5.4)."""

from collections.abc import Sequence

import keras
from keras import ops

from keras_transformer.training.recipe import TrainingRecipe
from keras_transformer.utils import special_tokens


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross entropy against a smoothed target, averaged over real tokens.

    Section 5.4: "we employed label smoothing of value eps_ls = 0.1". The
    target puts 1 - eps on the right token and spreads eps uniformly over the
    tokens a translation can contain:

        loss = (1 - eps) * -log p(y) + eps * mean_{v not in U}(-log p(v))

    where U (`unsmoothed_ids`) holds `<pad>`, `<s>` and `<unk>`: the search
    never emits the first two and no reference should contain the third, so
    tensor2tensor and fairseq keep smoothing mass off them too; spreading it
    there would teach the model to give probability to tokens it must not
    produce.

    Keras' `SparseCategoricalCrossentropy` has no label smoothing, hence this
    class. Padding never counts: tokens equal to `pad_token_id` get weight 0
    (multiplied with any `sample_weight` given), and the sum is divided by the
    weight of the real tokens, so long and short batches weigh each token alike.

    Args:
        label_smoothing: eps_ls.
        pad_token_id: the label id to ignore.
        unsmoothed_ids: token ids that get no smoothing mass (U above).
        from_logits: whether `y_pred` are logits (the model's output) or
            probabilities.

    Example:
    >>> import numpy as np
    >>> loss = LabelSmoothedCrossEntropy(label_smoothing=0.0)
    >>> logits = np.log(np.array([[[0.1, 0.2, 0.7], [0.3, 0.3, 0.4]]], "float32"))
    >>> round(float(loss(np.array([[2, 0]]), logits)), 4)  # -log 0.7; pad ignored
    0.3567
    >>> smoothed = LabelSmoothedCrossEntropy(0.1, unsmoothed_ids=(0,))
    >>> round(float(smoothed(np.array([[2, 0]]), logits)), 4)  # 0.9 * -log 0.7 + 0.1 * mean(-log 0.2, -log 0.7)
    0.4193
    """

    def __init__(
        self,
        label_smoothing: float = TrainingRecipe.label_smoothing,
        pad_token_id: int = special_tokens.PAD_ID,
        unsmoothed_ids: Sequence[int] = (special_tokens.PAD_ID, special_tokens.START_ID, special_tokens.UNK_ID),
        from_logits: bool = True,
        name: str = "label_smoothed_cross_entropy",
        **kwargs,
    ):
        kwargs.setdefault("reduction", "mean_with_sample_weight")
        super().__init__(name=name, **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1); got {label_smoothing}.")
        self.label_smoothing = label_smoothing
        self.pad_token_id = pad_token_id
        self.unsmoothed_ids = tuple(int(i) for i in unsmoothed_ids)
        self.from_logits = from_logits

    def __call__(self, y_true, y_pred, sample_weight=None):
        not_pad = ops.cast(ops.not_equal(y_true, self.pad_token_id), "float32")
        if sample_weight is not None:
            not_pad = not_pad * ops.cast(sample_weight, "float32")
        return super().__call__(y_true, y_pred, sample_weight=not_pad)

    def call(self, y_true, y_pred):
        y_pred = ops.cast(y_pred, "float32")
        target = self.smoothed_target(y_true, ops.shape(y_pred)[-1])
        if self.from_logits:
            # One cross entropy against the whole target distribution (on
            # TensorFlow its fused softmax kernel). Picking -log p(y) out with
            # a gather instead costs a dense scatter of the logits' size in
            # the gradient, which TensorFlow without XLA runs slowly.
            return ops.categorical_crossentropy(target, y_pred, from_logits=True)
        return -ops.sum(target * ops.log(ops.clip(y_pred, 1e-9, 1.0)), axis=-1)

    def smoothed_target(self, y_true, vocabulary_size: int):
        """The target distribution: 1 - eps on each label, eps spread over the tokens outside U."""
        eps = self.label_smoothing
        target = ops.one_hot(ops.cast(y_true, "int32"), vocabulary_size, dtype="float32")
        if eps == 0:
            return target
        vocabulary = ops.arange(vocabulary_size)
        smoothed = ops.ones_like(vocabulary, dtype="bool")
        for token_id in self.unsmoothed_ids:
            smoothed = smoothed & (vocabulary != token_id)
        smoothed = ops.cast(smoothed, "float32")
        return (1.0 - eps) * target + smoothed * (eps / ops.sum(smoothed))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "label_smoothing": self.label_smoothing,
                "pad_token_id": self.pad_token_id,
                "unsmoothed_ids": list(self.unsmoothed_ids),
                "from_logits": self.from_logits,
            }
        )
        return config
