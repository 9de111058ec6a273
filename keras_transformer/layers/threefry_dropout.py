"""Dropout (section 5.4) whose masks XLA draws fast on TensorFlow.

Keras' TensorFlow dropout draws its masks with TensorFlow's default
generator, Philox, and XLA on a CPU draws Philox numbers slowly: measured
here (2 threads, TensorFlow 2.21), 11.5 M uniform numbers took 105 ms with
Philox against 13 ms with Threefry, and a tiny-model training step spent
about 75 ms of its 150 ms forward pass drawing dropout masks. TensorFlow's
own kernels implement only Philox, so Threefry can be asked for only where
XLA compiles the step: `Transformer.train_step` says so with
`xla_compiled(...)` while Keras traces its compiled training function, and
everywhere else (eager, `jit_compile=False`, JAX, torch) this is Keras'
`Dropout` unchanged. The masks are as random either way, only different.
"""

import contextlib
import contextvars

import keras

_UNDER_XLA = contextvars.ContextVar("keras_transformer_dropout_under_xla", default=False)


@contextlib.contextmanager
def xla_compiled(compiled: bool = True):
    """Within it, `ThreefryDropout` layers being traced on TensorFlow draw
    their masks with Threefry (only valid inside an XLA-compiled function)."""
    token = _UNDER_XLA.set(bool(compiled) and keras.config.backend() == "tensorflow")
    try:
        yield
    finally:
        _UNDER_XLA.reset(token)


@keras.saving.register_keras_serializable(package="keras_transformer")
class ThreefryDropout(keras.layers.Dropout):
    """`keras.layers.Dropout` that draws Threefry masks inside `xla_compiled()`.

    Same rate, scaling (kept values times 1 / (1 - rate)), seeding (the
    layer's `SeedGenerator`) and variables as Keras' layer, so weights and
    configs are interchangeable with it. With a `noise_shape` it is Keras'
    layer everywhere (this package's layers use none).

    Example:
    >>> import numpy as np
    >>> layer = ThreefryDropout(0.5, seed=1)
    >>> y = np.asarray(layer(np.ones((2, 4), "float32"), training=True))
    >>> sorted(set(y.ravel().tolist())) in ([0.0, 2.0], [2.0], [0.0])
    True
    """

    def call(self, inputs, training=False):
        if not (training and self.rate > 0 and self.noise_shape is None and _UNDER_XLA.get()):
            return super().call(inputs, training=training)
        import tensorflow as tf

        # A Keras seed is two int64s; TensorFlow's stateless ops under XLA take int32.
        seed = tf.cast(tf.math.floormod(self.seed_generator.next(), tf.int32.max), tf.int32)
        return tf.nn.experimental.stateless_dropout(inputs, rate=self.rate, seed=seed, rng_alg="threefry")
