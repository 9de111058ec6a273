"""`speed_paths.eager_ops`' direct torch products give `keras.ops`' values to the
bit in float16 too, where Keras multiplies on a CPU in float32."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.speed_paths import eager_ops

pytestmark = pytest.mark.skipif(keras.config.backend() != "torch", reason="the direct torch operations")


def test_float16_matmul_gives_keras_values_to_the_bit():
    rng = np.random.default_rng(0)
    x = ops.convert_to_tensor(rng.standard_normal((64, 512)).astype("float16"))
    y = ops.convert_to_tensor(rng.standard_normal((512, 512)).astype("float16"))
    direct, keras_own = eager_ops.matmul(x, y), ops.matmul(x, y)
    assert direct.dtype == keras_own.dtype
    np.testing.assert_array_equal(ops.convert_to_numpy(direct), ops.convert_to_numpy(keras_own))
