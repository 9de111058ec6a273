"""The output projection of a search's steps, `hidden @ E^T` (section 3.4), computed another way.

A decoding step ends in the projection onto the whole vocabulary, its largest
product. Three paths compute it faster where the projection is the plain
tied product (no quantization, soft cap or other output dtype):

- `transposed_bf16_kernel` (TensorFlow, bfloat16 layers summing in float32
  under XLA on a CPU with bfloat16 units): `E^T` cast to bfloat16 and
  transposed once per search, since XLA's bfloat16 kernels take the
  vocabulary as the second operand's last axis;
- `vocabulary_parts` (JAX, 128 rows or more, 16,000 tokens or more): the
  product as 4 products over slices of the vocabulary, run side by side;
- `torch_transposed_copy` (torch, float32): `E^T` laid out in memory as such,
  which torch's kernels read faster than `E` transposed by strides.

`step_logits(backbone, runtime)` is called inside the traced search,
outside its loop; each path gives the same translations.

Example:
>>> import numpy as np
>>> h, e = np.ones((2, 1, 3), "float32"), np.arange(15, dtype="float32").reshape(5, 3)
>>> np.asarray(logits_by_parts(h, e, parts=2))[0, 0].tolist()
[3.0, 12.0, 21.0, 30.0, 39.0]
"""

from collections.abc import Callable

import keras
from keras import ops

from keras_transformer.speed_paths import bfloat16_products as products
from keras_transformer.speed_paths.derived_tensors import derived
from keras_transformer.speed_paths.registry import SpeedPath, register
from keras_transformer.speed_paths.runtime import Runtime

# Beam search of a batch: from this many rows and vocabulary entries, the
# projection is computed in `VOCABULARY_PARTS` independent products.
PARTS_MIN_ROWS = 128
PARTS_MIN_VOCABULARY = 16_000
VOCABULARY_PARTS = 4

TRANSPOSED_BF16_KERNEL = register(
    SpeedPath(
        "transposed_bf16_kernel",
        "XLA's bfloat16 CPU kernels take E^T laid out as such; E transposed by strides is multiplied in float32",
        lambda runtime: runtime.backend == "tensorflow" and runtime.on_cpu and runtime.has_bfloat16_units,
    )
)
VOCABULARY_PARTS_PATH = register(
    SpeedPath(
        "vocabulary_parts",
        "XLA's CPU runtime runs independent products over parts of a large vocabulary side by side",
        lambda runtime: runtime.backend == "jax",
    )
)
TORCH_TRANSPOSED_COPY = register(
    SpeedPath(
        "torch_transposed_copy",
        "torch's CPU kernels read E^T from a contiguous copy faster than E transposed by strides",
        lambda runtime: runtime.backend == "torch",
    )
)
# The transposed copies, by matrix (`speed_paths.derived_tensors`).
_TRANSPOSED: dict[int, tuple] = {}


def step_logits(backbone, runtime: Runtime) -> Callable:
    """The function a search's steps turn decoder states `(rows, 1, d_model)`
    into logits with on `runtime`: one of the module's paths, or
    `backbone.logits`. Call it inside the traced search, outside its loop."""
    embedding = backbone.decoder_token_embedding
    if not _is_plain_projection(embedding):
        return backbone.logits
    if (
        TRANSPOSED_BF16_KERNEL.applies_to(runtime)
        and backbone.compute_dtype == "bfloat16"
        and products.layers_sum_in_float32()
    ):
        kernel = ops.transpose(ops.cast(embedding.embeddings, "bfloat16"))

        def logits_from_transposed_kernel(hidden):
            return _with_bias(backbone, products.dense(hidden, kernel))

        return logits_from_transposed_kernel
    if VOCABULARY_PARTS_PATH.applies_to(runtime) and embedding.input_dim >= PARTS_MIN_VOCABULARY:

        def logits_of_many_rows_by_parts(hidden):
            rows = hidden.shape[0]
            if rows is None or rows < PARTS_MIN_ROWS:
                return backbone.logits(hidden)
            return _with_bias(backbone, logits_by_parts(hidden, embedding.embeddings, VOCABULARY_PARTS))

        return logits_of_many_rows_by_parts
    if TORCH_TRANSPOSED_COPY.applies_to(runtime) and backbone.compute_dtype == "float32":
        kernel = torch_transposed(embedding.embeddings)

        def logits_from_transposed_copy(hidden):
            return _with_bias(backbone, products.dense(hidden, kernel))

        return logits_from_transposed_copy
    return backbone.logits


def torch_transposed(variable: keras.Variable):
    """A torch matrix variable's transpose as a contiguous copy, kept while the
    variable lives and made again after it changes (training, loading); the
    price is one more copy of `E` in memory."""
    import torch

    matrix = variable.value

    def transposed():
        with torch.inference_mode(False):  # a plain tensor, whichever mode the first search ran in
            return matrix.detach().t().contiguous()

    return derived(_TRANSPOSED, matrix, (), transposed)


def logits_by_parts(hidden, embeddings, parts: int):
    """`hidden @ embeddings^T` as `parts` products over consecutive slices of
    the vocabulary, joined: the same logits, as independent operations."""
    vocabulary = ops.shape(embeddings)[0]
    edges = [vocabulary * i // parts for i in range(parts + 1)]
    embeddings = ops.cast(embeddings, hidden.dtype)
    return ops.concatenate(
        [products.dense(hidden, ops.transpose(embeddings[start:end])) for start, end in zip(edges, edges[1:])], axis=-1
    )


def _with_bias(backbone, logits):
    return logits if backbone.logits_bias is None else backbone.logits_bias(logits)


def _is_plain_projection(embedding) -> bool:
    """Whether the embedding's reverse call is `hidden @ E^T` of its unquantized
    tied matrix and nothing else, so that a search may compute it itself."""
    return (
        embedding.tie_weights
        and embedding.quantization_mode is None
        and embedding.reverse_dtype is None
        and embedding.logit_soft_cap is None
    )
