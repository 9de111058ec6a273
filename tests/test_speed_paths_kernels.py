"""The search's faster kernels give the plain kernels' values: greedy search's
argmax (`first_argmax_by_max`), beam search's best extensions
(`chunked_top_k`) and a step's logits (`output_projection`)."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from helpers import TINY_CONFIG
from keras_transformer import beam_search
from keras_transformer.generation.search import NEG_INF, best_extensions, first_argmax
from keras_transformer.speed_paths import Runtime, describe_runtime, output_projection
from keras_transformer.speed_paths.chunked_top_k import best_extensions_in_chunks
from keras_transformer.speed_paths.first_argmax_by_max import first_argmax_by_max

PAD, START, END = 0, 2, 3
# Where the chunks are taken: traced for XLA (torch's fused log-softmax rounds its own way).
chunks_apply = pytest.mark.skipif(keras.config.backend() == "torch", reason="chunked_top_k is for traced searches")


def compiled(function):
    """`function` as the search runs it: one XLA program on TensorFlow and JAX."""
    if keras.config.backend() == "jax":
        import jax

        return jax.jit(function)
    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(function, jit_compile=True, autograph=False)
    return function


@pytest.mark.parametrize("argmax", [first_argmax, first_argmax_by_max])
@pytest.mark.parametrize("compile", [False, True])
def test_both_argmaxes_are_argmax_with_ties_to_the_first_index(argmax, compile):
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(64, 300)).astype("float32")
    scores[::3, 7] = scores[::3, 200] = 50.0  # ties: the first index wins, as with argmax
    scores[5] = -np.inf
    expected = np.argmax(scores, axis=-1)
    found = (compiled(argmax) if compile else argmax)(ops.convert_to_tensor(scores))
    np.testing.assert_array_equal(ops.convert_to_numpy(found), expected)


@chunks_apply
@pytest.mark.parametrize("vocab", [1000, 1009])  # chunks of 8; padded (a prime)
def test_best_extensions_in_chunks_are_the_top_k_of_every_extension(vocab):
    rng = np.random.default_rng(vocab)
    banned, end, count = (0, 2, 9), 3, 8  # token 9 is banned inside the second chunk
    # Rounded logits: many ties, which must still resolve to the lowest index.
    logits = np.round(rng.normal(size=(6, 4, vocab)) * 3).astype("float32")
    logits[1, :, -5:] = 20.0  # the best tokens in the last (padded) chunk
    logits[2] = 0.0  # all tied
    logits[4, :, 9] = 30.0  # a banned token is the largest logit
    alive = (rng.normal(size=(6, 4)) * 3).astype("float32")
    alive[3, 1:] = NEG_INF  # as at the first step: only beam 0 is live
    forced = np.array([False, True, False, False, False, False])  # a sentence at its length limit

    def every_extension(logits, alive, forced):
        return best_extensions(logits, alive, count, banned, forced, end)

    def in_chunks(logits, alive, forced):
        return best_extensions_in_chunks(logits, alive, count, banned, forced, end, chunk=8)

    arguments = [ops.convert_to_tensor(a) for a in (logits, alive, forced)]
    expected = [ops.convert_to_numpy(t) for t in compiled(every_extension)(*arguments)]
    found = [ops.convert_to_numpy(t) for t in compiled(in_chunks)(*arguments)]
    np.testing.assert_array_equal(found[0].view("int32"), expected[0].view("int32"))  # to the bit
    if keras.config.backend() != "torch":  # torch.topk does not promise an order among ties
        np.testing.assert_array_equal(found[1], expected[1])
    assert set(found[1][4] % vocab).isdisjoint(banned)
    np.testing.assert_array_equal(found[1][1][:4] % vocab, [end] * 4)  # each beam's end token first


@chunks_apply
def test_beam_search_finds_the_same_with_or_without_chunks():
    """The search with its best extensions in chunks and over every
    extension: the same tokens and scores, to the bit."""
    vocab, batch, beam_size = 1500, 3, 4
    table = np.random.RandomState(0).normal(0, 3, (vocab, vocab)).astype("float32")
    table[:, END] -= 4.0  # translations of a few tokens, some ending before their limit

    def translate(table, first, max_lengths, extensions):
        def step(token_ids, index, cache):
            return ops.take(table, token_ids[:, 0], axis=0), cache

        special = dict(start_token_id=START, end_token_id=END, pad_token_id=PAD)
        cache = ops.zeros((batch, 1), "int32")
        return beam_search(step, first, cache, max_lengths, 10, beam_size, 0.6, best_extensions=extensions, **special)

    arguments = [ops.convert_to_tensor(a) for a in (table, table[[5, 6, 7]], np.array([4, 6, 9], "int32"))]
    chunked = compiled(lambda *args: translate(*args, best_extensions_in_chunks))
    whole = compiled(lambda *args: translate(*args, best_extensions))
    chunked, whole = ([ops.convert_to_numpy(t) for t in search(*arguments)] for search in (chunked, whole))
    np.testing.assert_array_equal(chunked[0], whole[0])
    np.testing.assert_array_equal(chunked[1].view("int32"), whole[1].view("int32"))
    assert (chunked[0] == END).any(axis=1).all()


def test_logits_by_parts_are_the_logits_of_the_whole_vocabulary():
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(130, 1, 16)).astype("float32")
    embeddings = rng.normal(size=(1001, 16)).astype("float32")  # parts of 250 and 251 tokens
    np.testing.assert_allclose(
        ops.convert_to_numpy(output_projection.logits_by_parts(hidden, embeddings, parts=4)),
        hidden @ embeddings.T,
        rtol=1e-5,
        atol=1e-4,
    )


def test_a_search_steps_logits_are_the_backbones_logits_for_any_rows(monkeypatch):
    # 128 rows and 16,000 tokens: on JAX the step computes them by parts.
    backbone = kt.TransformerBackbone(vocabulary_size=16_000, use_logits_bias=True, **TINY_CONFIG)
    backbone.logits_bias.bias.assign(np.linspace(-1, 1, 16_000).astype("float32"))
    logits_of = output_projection.step_logits(backbone, describe_runtime())
    by_parts = []
    original = output_projection.logits_by_parts
    monkeypatch.setattr(
        output_projection, "logits_by_parts", lambda *args: by_parts.append(len(args[0])) or original(*args)
    )
    for rows in (8, 128):
        hidden = np.random.default_rng(rows).normal(size=(rows, 1, 16)).astype("float32")
        np.testing.assert_allclose(
            ops.convert_to_numpy(logits_of(hidden)),
            ops.convert_to_numpy(backbone.logits(hidden)),
            rtol=1e-5,
            atol=1e-5,
        )
    assert by_parts == ([128] if keras.config.backend() == "jax" else [])


def test_a_quantized_or_small_model_takes_the_backbones_logits():
    runtime = describe_runtime()
    small = kt.TransformerBackbone(vocabulary_size=100, **TINY_CONFIG)
    # On torch, a float32 model's steps read E^T from a transposed copy.
    assert (output_projection.step_logits(small, runtime) == small.logits) == (runtime.backend != "torch")
    large = kt.TransformerBackbone(vocabulary_size=16_000, **TINY_CONFIG)
    large.quantize("int8")
    assert output_projection.step_logits(large, runtime) == large.logits
    plain = Runtime(runtime.backend, runtime.device, paths_off=frozenset({"all"}))
    assert output_projection.step_logits(small, plain) == small.logits


@pytest.mark.skipif(keras.config.backend() != "torch", reason="the transposed copy of E is torch's")
def test_the_transposed_embeddings_are_kept_and_made_again_after_the_weights_change():
    backbone = kt.TransformerBackbone(vocabulary_size=100, **TINY_CONFIG)
    embeddings = backbone.decoder_token_embedding.embeddings
    first = output_projection.torch_transposed(embeddings)
    assert first.is_contiguous() and output_projection.torch_transposed(embeddings) is first
    np.testing.assert_array_equal(ops.convert_to_numpy(first), ops.convert_to_numpy(embeddings).T)
    embeddings.assign(ops.convert_to_numpy(embeddings) + 1.0)  # as training or loading weights would
    again = output_projection.torch_transposed(embeddings)
    assert again is not first
    np.testing.assert_array_equal(ops.convert_to_numpy(again), ops.convert_to_numpy(embeddings).T)
