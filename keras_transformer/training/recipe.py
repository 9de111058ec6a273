"""The training recipe of section 5: each of the paper's training defaults, written once.

`TrainingRecipe()` is the paper's recipe; the optimizer, the schedule, the
loss, `Transformer.compile`, the backbone's dropout, `keras_transformer.training_run.trainer`
and `keras-transformer train` all take their defaults from it.
"""

import dataclasses

from keras_transformer.layers.encoder_block import RESIDUAL_DROPOUT


@dataclasses.dataclass(frozen=True)
class TrainingRecipe:
    """How a Transformer is trained (section 5), with the paper's values by default.

    Attributes:
        warmup_steps: updates of linear learning-rate warmup (5.3).
        peak_learning_rate: the highest learning rate, reached after
            `warmup_steps`; `None` for the paper's d_model^-0.5 * warmup_steps^-0.5.
        label_smoothing: eps_ls (5.4).
        dropout: P_drop (5.4), the dropout of every sublayer and of the embedding sums.
        beta_1, beta_2, epsilon: Adam's (5.3).
        accumulate: micro-batches per update (gradient accumulation); 1 for none.

    Example:
    >>> recipe = TrainingRecipe(warmup_steps=2000, peak_learning_rate=0.005)
    >>> recipe.label_smoothing, recipe.beta_2
    (0.1, 0.98)
    """

    warmup_steps: int = 4000
    peak_learning_rate: float | None = None
    label_smoothing: float = 0.1
    dropout: float = RESIDUAL_DROPOUT
    beta_1: float = 0.9
    beta_2: float = 0.98
    epsilon: float = 1e-9
    accumulate: int = 1

    def __post_init__(self):
        if self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be at least 1; got {self.warmup_steps}.")
        if self.peak_learning_rate is not None and not self.peak_learning_rate > 0:
            raise ValueError(f"peak_learning_rate must be positive (or None); got {self.peak_learning_rate}.")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1); got {self.label_smoothing}.")
        if not isinstance(self.accumulate, int) or self.accumulate < 1:
            raise ValueError(f"accumulate must be an integer of at least 1; got {self.accumulate!r}.")
