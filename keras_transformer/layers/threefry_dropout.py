"""Dropout (section 5.4) whose masks XLA draws fast, on TensorFlow and JAX.

Keras draws dropout masks with TensorFlow's default generator (Philox) and
with JAX's `jax.random` (Threefry written in JAX operations); XLA runs both
on a CPU more slowly than its own Threefry generator
(`jax.lax.rng_bit_generator` on JAX), which this layer uses
(`benchmarks/RESULTS.md`, "Why the code takes these paths").

TensorFlow's own kernels implement only Philox, so there Threefry can be
asked for only where XLA compiles the step: `Transformer.train_step` says
so with `xla_compiled(...)` while Keras traces its compiled training
function. JAX always runs through XLA. Elsewhere (TensorFlow outside
`xla_compiled`, torch) this is Keras' `Dropout` unchanged. The masks are
as random either way, only different.
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
    """`keras.layers.Dropout` that draws XLA's Threefry masks: on JAX, and on
    TensorFlow inside `xla_compiled()`.

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
        if not (training and 0 < self.rate < 1 and self.noise_shape is None):
            return super().call(inputs, training=training)
        backend = keras.config.backend()
        if backend == "tensorflow" and _UNDER_XLA.get():
            import tensorflow as tf

            # A Keras seed is two int64s; TensorFlow's stateless ops under XLA take int32.
            seed = tf.cast(tf.math.floormod(self.seed_generator.next(), tf.int32.max), tf.int32)
            return tf.nn.experimental.stateless_dropout(inputs, rate=self.rate, seed=seed, rng_alg="threefry")
        if backend == "jax":
            import jax
            import jax.numpy as jnp

            # Threefry's state: the layer's two-word seed as key, counter 0.
            seed = jnp.asarray(self.seed_generator.next()).astype(jnp.uint32)
            state = jnp.concatenate([seed, jnp.zeros((2,), jnp.uint32)])
            _, bits = jax.lax.rng_bit_generator(
                state, inputs.shape, dtype=jnp.uint32, algorithm=jax.lax.RandomAlgorithm.RNG_THREE_FRY
            )
            keep_prob = 1.0 - self.rate
            keep = bits < jnp.uint32(min(round(keep_prob * 2**32), 2**32 - 1))
            return jnp.where(keep, inputs / jnp.asarray(keep_prob, inputs.dtype), jnp.zeros_like(inputs))
        return super().call(inputs, training=training)
