"""The optimizer of section 5.3."""

import keras

from keras_transformer.training.schedule import TransformerSchedule


def paper_optimizer(hidden_dim: int, warmup_steps: int = 4000, scale: float = 1.0, **kwargs) -> keras.optimizers.Adam:
    """Adam(beta1=0.9, beta2=0.98, eps=1e-9) on the section 5.3 schedule.

    Example:
    >>> optimizer = paper_optimizer(hidden_dim=512)
    >>> optimizer.beta_2, optimizer.epsilon
    (0.98, 1e-09)
    """
    return keras.optimizers.Adam(
        learning_rate=TransformerSchedule(hidden_dim, warmup_steps, scale),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        **kwargs,
    )
