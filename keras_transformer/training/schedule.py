"""The learning-rate schedule of section 5.3."""

import keras
from keras import ops

from keras_transformer.training.recipe import TrainingRecipe


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup, then inverse square-root decay (section 5.3).

        lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)

    The peak, at `step == warmup_steps`, is `scale * (d_model *
    warmup_steps)^-0.5`: 7.0e-4 for the base model. `scale` (1 in the paper)
    lets a recipe set another peak, e.g. Multi30k recipes use 0.005;
    `TransformerSchedule.with_peak(0.005, warmup_steps=2000, hidden_dim=128)`.

    Args:
        hidden_dim: d_model.
        warmup_steps: updates of linear warmup (`TrainingRecipe`'s, the paper's, by default).
        scale: a constant factor on the whole curve.

    Example:
    >>> schedule = TransformerSchedule(hidden_dim=512, warmup_steps=4000)
    >>> round(float(schedule(3999)), 6)  # step 4000, the peak
    0.000699
    """

    def __init__(self, hidden_dim: int, warmup_steps: int = TrainingRecipe.warmup_steps, scale: float = 1.0):
        super().__init__()
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be at least 1; got {warmup_steps}.")
        self.hidden_dim = hidden_dim
        self.warmup_steps = warmup_steps
        self.scale = scale

    @classmethod
    def with_peak(cls, peak: float, warmup_steps: int, hidden_dim: int) -> "TransformerSchedule":
        """The schedule whose highest learning rate is `peak`."""
        return cls(hidden_dim, warmup_steps, scale=peak * (hidden_dim * warmup_steps) ** 0.5)

    def __call__(self, step):
        # Optimizer iterations count from 0; the paper's steps count from 1.
        step = ops.cast(step, "float32") + 1.0
        decay = ops.minimum(ops.rsqrt(step), step * self.warmup_steps**-1.5)
        return self.scale * self.hidden_dim**-0.5 * decay

    def get_config(self):
        return {
            "hidden_dim": self.hidden_dim,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
        }
