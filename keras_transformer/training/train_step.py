"""Where a training step is built: the speed paths of this runtime attached,
the optimizer's variables made before the step is traced.

`Transformer.make_train_function` calls `prepare_train_step`, as its search
is built in `generation.decoding.search_with_speed_paths`: the model and its
layers stay plain Keras, and the paths are chosen here, once per step built.
"""

import keras

from keras_transformer import speed_paths


def prepare_train_step(model: keras.Model) -> tuple:
    """Prepares `model` (a compiled Keras model) for its next traced training step.

    Attaches the speed paths that apply to this runtime and to how the step
    runs (compiled with XLA, or eagerly), and builds the optimizer. Without a
    distribution strategy, Keras' TensorFlow trainer leaves the optimizer
    unbuilt until the first traced step creates its variables, and a
    `tf.function` that creates variables is traced twice; built here, it is
    traced once. Keras builds it so itself on JAX, torch and under a strategy.

    Returns:
        The names of the speed paths attached.

    Example:

    >>> import keras
    >>> model = keras.Sequential([keras.layers.Dense(2)])
    >>> model.compile(optimizer="adam", loss="mse")
    >>> model.build((None, 3))
    >>> prepare_train_step(model) == speed_paths.attached_paths(model)
    True
    >>> model.optimizer.built
    True
    """
    compiled = bool(model.jit_compile) and not model.run_eagerly
    attached = speed_paths.attach(model, compiled=compiled, training=True)
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return attached
