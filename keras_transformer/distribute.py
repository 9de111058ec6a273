"""Training on several devices: one name per strategy, one scope to train in.

- `"none"`: the default device.
- `"mirrored"`: `tf.distribute.MirroredStrategy` over every visible GPU (or
  the logical CPUs TensorFlow was given); TensorFlow backend only. Keras 3
  needs the model built, compiled and fit inside `strategy.scope()`.
- `"jax-data-parallel"`: `keras.distribution.DataParallel` over all JAX
  devices; JAX backend only. It is set globally with
  `keras.distribution.set_distribution` for the duration of the scope, and
  also spans hosts once `jax.distributed.initialize()` has run.

Example:
>>> import keras
>>> with training_scope("none"):
...     model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
"""

import contextlib

import keras

STRATEGIES = ("none", "mirrored", "jax-data-parallel")


def training_scope(strategy: str = "none") -> contextlib.AbstractContextManager:
    """A context manager to build, compile and fit a model in.

    Args:
        strategy: one of `"none"`, `"mirrored"`, `"jax-data-parallel"`.

    Raises:
        ValueError: for an unknown strategy, or one the Keras backend lacks.
    """
    backend = keras.config.backend()
    if strategy == "none":
        return contextlib.nullcontext()
    if strategy == "mirrored":
        if backend != "tensorflow":
            raise ValueError(
                f"--strategy mirrored needs the TensorFlow backend (KERAS_BACKEND=tensorflow); "
                f"this is {backend}. On JAX use --strategy jax-data-parallel."
            )
        import tensorflow as tf

        return tf.distribute.MirroredStrategy().scope()
    if strategy == "jax-data-parallel":
        if backend != "jax":
            raise ValueError(
                f"--strategy jax-data-parallel needs the JAX backend (KERAS_BACKEND=jax); "
                f"this is {backend}. On TensorFlow use --strategy mirrored."
            )
        return _distribution_scope(keras.distribution.DataParallel())
    raise ValueError(f"Unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}.")


@contextlib.contextmanager
def _distribution_scope(distribution):
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(distribution)
    try:
        yield distribution
    finally:
        keras.distribution.set_distribution(previous)

