"""Speed path `threefry_dropout`: dropout masks (section 5.4) drawn by XLA's own Threefry generator.

Keras draws dropout masks with TensorFlow's default generator (Philox) and
with JAX's `jax.random` (Threefry written in JAX operations); XLA runs both
on a CPU more slowly than its own Threefry generator
(`jax.lax.rng_bit_generator` on JAX), which this path draws with.
TensorFlow's own kernels implement only Philox, so there Threefry is
attached only for a step that XLA compiles (`Runtime.under_xla`); JAX
always runs through XLA.

Attached, Keras' `Dropout` layers keep their rate, scaling (kept values
times 1 / (1 - rate)), seeding (the layer's `SeedGenerator`) and variables;
the masks are as random, only different. With a `noise_shape` (this
package's layers use none), outside training, or at rate 0 or 1, a layer
runs Keras' own `call`.
"""

import types

import keras

from keras_transformer.speed_paths.registry import SpeedPath, register
from keras_transformer.speed_paths.runtime import Runtime


def tensorflow_dropout(layer: keras.layers.Dropout, inputs):
    """`inputs` with Threefry's dropout mask, inside an XLA-compiled TensorFlow function."""
    import tensorflow as tf

    # A Keras seed is two int64s; TensorFlow's stateless ops under XLA take int32.
    seed = tf.cast(tf.math.floormod(layer.seed_generator.next(), tf.int32.max), tf.int32)
    return tf.nn.experimental.stateless_dropout(inputs, rate=layer.rate, seed=seed, rng_alg="threefry")


def jax_dropout(layer: keras.layers.Dropout, inputs):
    """`inputs` with a dropout mask of `jax.lax.rng_bit_generator`'s Threefry bits."""
    import jax
    import jax.numpy as jnp

    # Threefry's state: the layer's two-word seed as key, counter 0.
    seed = jnp.asarray(layer.seed_generator.next()).astype(jnp.uint32)
    state = jnp.concatenate([seed, jnp.zeros((2,), jnp.uint32)])
    _, bits = jax.lax.rng_bit_generator(
        state, inputs.shape, dtype=jnp.uint32, algorithm=jax.lax.RandomAlgorithm.RNG_THREE_FRY
    )
    keep_prob = 1.0 - layer.rate
    keep = bits < jnp.uint32(min(round(keep_prob * 2**32), 2**32 - 1))
    return jnp.where(keep, inputs / jnp.asarray(keep_prob, inputs.dtype), jnp.zeros_like(inputs))


def _patch(layer: keras.layers.Layer, runtime: Runtime) -> dict:
    if not isinstance(layer, keras.layers.Dropout):
        return {}
    draw = jax_dropout if runtime.backend == "jax" else tensorflow_dropout

    def call(self, inputs, training=False):
        if training and 0 < self.rate < 1 and self.noise_shape is None:
            return draw(self, inputs)
        return type(self).call(self, inputs, training=training)

    return {"call": types.MethodType(call, layer)}


register(
    SpeedPath(
        "threefry_dropout",
        "XLA draws its own Threefry bits faster on a CPU than Philox or jax.random's Threefry",
        lambda runtime: runtime.backend == "jax" or (runtime.backend == "tensorflow" and runtime.under_xla),
        patch=_patch,
    )
)
