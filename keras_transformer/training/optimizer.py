"""The optimizer of section 5.3."""

import math

import keras

from keras_transformer.training.recipe import TrainingRecipe
from keras_transformer.training.schedule import TransformerSchedule


def paper_optimizer(
    hidden_dim: int, warmup_steps: int = TrainingRecipe.warmup_steps, scale: float = 1.0, **kwargs
) -> keras.optimizers.Adam:
    """Adam(beta1=0.9, beta2=0.98, eps=1e-9) on the section 5.3 schedule.

    Example:
    >>> optimizer = paper_optimizer(hidden_dim=512)
    >>> optimizer.beta_2, optimizer.epsilon
    (0.98, 1e-09)
    """
    return recipe_optimizer(TrainingRecipe(warmup_steps=warmup_steps), hidden_dim, scale=scale, **kwargs)


def recipe_optimizer(recipe: TrainingRecipe, hidden_dim: int, *, scale: float = 1.0, **kwargs) -> keras.optimizers.Adam:
    """Adam on the section 5.3 schedule as `recipe` sets them, per update.

    Its peak is `recipe.peak_learning_rate` when given (otherwise `scale`
    times the paper's). With `recipe.accumulate > 1` it averages the
    gradients of that many micro-batches per update, and the learning rate
    of update k is still the schedule's at step k: Keras evaluates the
    schedule at the micro-batch count, and the inverse square-root curve
    with N times the warmup and sqrt(N) times the scale, at micro-batch
    k*N - 1, equals the original curve at update k - 1.

    Args:
        recipe: the betas, epsilon, warmup, peak and accumulation.
        hidden_dim: d_model, which sets the paper's peak.
        scale: a factor on the schedule when `recipe` names no peak.
        **kwargs: passed to `keras.optimizers.Adam`.

    Example:
    >>> recipe = TrainingRecipe(warmup_steps=10, peak_learning_rate=0.005, accumulate=2)
    >>> optimizer = recipe_optimizer(recipe, hidden_dim=16)
    >>> optimizer.gradient_accumulation_steps, optimizer.beta_2
    (2, 0.98)
    """
    warmup = recipe.warmup_steps
    if recipe.peak_learning_rate:
        scale = TransformerSchedule.with_peak(recipe.peak_learning_rate, warmup, hidden_dim).scale
    if recipe.accumulate > 1:
        warmup, scale = warmup * recipe.accumulate, scale * math.sqrt(recipe.accumulate)
        kwargs["gradient_accumulation_steps"] = recipe.accumulate
    return keras.optimizers.Adam(
        learning_rate=TransformerSchedule(hidden_dim, warmup, scale),
        beta_1=recipe.beta_1,
        beta_2=recipe.beta_2,
        epsilon=recipe.epsilon,
        **kwargs,
    )
