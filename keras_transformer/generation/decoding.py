"""Decoding a batch of token ids as one compiled graph (section 6.1).

`search_step` runs the encoder once, computes the cross-attention keys and
values of its output once (one copy per sentence, which all its beams read:
`layers.cached_attention.attend_cached`), and hands a cached one-position `step` to the greedy or
beam search of `keras_transformer.generation.search`. `compiled_search`
attaches the layers' speed paths chosen for the runtime (`speed_paths.attach`),
gives the search the kernels of its own (`speed_paths.search_kernels`) and
compiles it per backend: XLA on TensorFlow, `jax.jit` on JAX (stateless, the
variables passed in), under `torch.inference_mode` on torch, eagerly or, with
`jit_compile=True`, each step of the search through `torch.compile`.
"""

from collections.abc import Callable
from functools import partial

import keras

from keras_transformer import speed_paths
from keras_transformer.generation import search
from keras_transformer.generation.search import SearchKernels
from keras_transformer.generation.settings import SearchSettings
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.speed_paths import eager_ops as ops
from keras_transformer.speed_paths.runtime import Runtime, describe_runtime
from keras_transformer.speed_paths.search_kernels import search_kernels


def resolve_jit_compile(
    jit_compile: bool | str = "auto", training_dtype: str | None = None, runtime: Runtime | None = None
) -> bool:
    """`"auto"` means XLA on TensorFlow and JAX, on CPUs too, except for
    training in bfloat16 on TensorFlow on a CPU with bfloat16 instructions.

    Keras resolves `jit_compile="auto"` to False for TensorFlow on a machine
    without a GPU; here CPUs keep XLA, which speeds up training and decoding
    there too. Keras' other reason stays: no XLA inside a `tf.distribute`
    strategy's scope (its mirrored variables live on several devices, which
    XLA refuses). On torch, "auto" stays eager: `torch.compile` (opt-in
    with `jit_compile=True`) takes 5-31 s per batch shape on a small CPU,
    which pays off only after 1,000-10,000 sentences of that shape.

    Under XLA, TensorFlow keeps a bfloat16 step's weight gradients in
    float32 (`speed_paths.bfloat16_products`), while its own kernels run them on the CPU's
    bfloat16 units: so bfloat16 training there runs without XLA, and
    decoding, many small steps, with it. The measurements are in
    `benchmarks/RESULTS.md` ("Why the code takes these paths").

    Args:
        jit_compile: True, False or "auto".
        training_dtype: for a training step, the model's compute dtype
            (`"bfloat16"` under `mixed_bfloat16`); `None` for decoding.
        runtime: the backend, device and CPU (by default this process's).

    Example:
    >>> resolve_jit_compile(False)
    False
    """
    if jit_compile != "auto":
        return bool(jit_compile)
    runtime = runtime or describe_runtime()
    if runtime.backend == "tensorflow":
        import tensorflow as tf

        if tf.distribute.has_strategy():
            return False
        return not (training_dtype == "bfloat16" and runtime.on_cpu and runtime.has_bfloat16_units)
    return runtime.backend == "jax"


def search_step(
    backbone: TransformerBackbone,
    inputs: dict,
    beam_size: int | None = SearchSettings.beam_size,
    alpha: float = SearchSettings.alpha,
    max_extra_length: int = SearchSettings.max_extra_length,
    with_completion: bool = False,
    num_hypotheses: int = 1,
    kernels: SearchKernels | None = None,
) -> dict:
    """Decodes one batch of token ids; traceable as a single graph.

    Args:
        backbone: the network; its special ids are the search's.
        inputs: `encoder_token_ids`, `encoder_padding_mask` (`(batch,
            source_length)`) and `decoder_token_ids`, whose static length is
            the output buffer, start token included. With a
            `decoder_padding_mask`, `decoder_token_ids` is also a prompt, as
            in KerasHub: the start token and a target prefix where the mask
            is set, which every translation continues (CTranslate2's
            `target_prefix`). The prefix counts towards the length limit.
        beam_size, alpha, max_extra_length: see `SearchSettings`; the
            source length excludes start and end tokens, and the end token
            comes on top of the extra tokens.
        with_completion: the buffer may be shorter than that limit; the
            output then also holds `complete`, which sentences were
            finished within it (see `search.beam_search`).
        num_hypotheses: with beam search, the n best hypotheses of each
            sentence instead of the best one (see `search.beam_search`).
        kernels: how the search computes its logits, choices and steps
            (`search.SearchKernels`; by default the plain ones). Its
            `compile_body` compiles each step, decoding and choosing; the
            first step runs as is.

    Returns:
        `{"decoder_token_ids", "decoder_padding_mask"}`: the translations
        as token ids, start and end tokens included. With `num_hypotheses`
        n > 1, both are `(batch, n, buffer)`, best first, and
        `hypothesis_found` `(batch, n)` says which hypotheses the search finished.
    """
    if num_hypotheses > 1 and beam_size is None:
        raise ValueError(f"Greedy search finds one hypothesis; num_hypotheses={num_hypotheses} needs beam search.")
    source_ids = inputs["encoder_token_ids"]
    source_mask = inputs["encoder_padding_mask"]
    batch = ops.shape(source_ids)[0]
    buffer_length = ops.shape(inputs["decoder_token_ids"])[1]
    start_token_id, end_token_id = backbone.start_token_id, backbone.end_token_id
    pad_token_id = backbone.pad_token_id
    kernels = kernels or SearchKernels()

    encoder_output = backbone.encode(source_ids, source_mask)
    # Source tokens without start and end tokens (whichever packing the
    # tokenizer uses), plus the extra length, plus the end token.
    is_text = ops.cast(source_mask, "bool") & (source_ids != start_token_id) & (source_ids != end_token_id)
    max_lengths = ops.sum(ops.cast(is_text, "int32"), axis=-1) + max_extra_length + 1

    cross_cache = backbone.cross_attention_cache(encoder_output)
    # Made once per traced search, outside its loop.
    logits_of = kernels.step_logits(backbone)
    start = ops.full((batch, 1), start_token_id, dtype="int32")
    logits, self_cache = backbone.decode_step(
        start, 0, source_mask, backbone.empty_cache(batch, buffer_length), cross_cache, logits_of
    )
    first_logits = ops.cast(logits[:, 0, :], "float32")

    def step(token_ids, index, cache):
        logits, cache = backbone.decode_step(token_ids, index, source_mask, cache, cross_cache, logits_of)
        return ops.cast(logits[:, 0, :], "float32"), cache

    if "decoder_padding_mask" in inputs:
        prefix = ops.cast(inputs["decoder_token_ids"], "int32")
        forced = ops.cast(inputs["decoder_padding_mask"], "bool") & (ops.arange(buffer_length)[None, :] > 0)
        max_lengths = ops.maximum(max_lengths, ops.sum(ops.cast(forced, "int32"), axis=-1) + 1)
        first_logits = _force_prefix(first_logits, prefix, forced, 1)
        step = _with_prefix(step, prefix, forced, 1 if beam_size is None else beam_size)

    options = dict(
        start_token_id=start_token_id,
        end_token_id=end_token_id,
        pad_token_id=pad_token_id,
        with_completion=with_completion,
        compile_body=kernels.compile_body,
    )
    if beam_size is None:
        found = search.greedy_search(
            step, first_logits, self_cache, max_lengths, buffer_length, argmax=kernels.argmax, **options
        )
    else:
        found = search.beam_search(
            step,
            first_logits,
            self_cache,
            max_lengths,
            buffer_length,
            beam_size,
            alpha,
            num_hypotheses=num_hypotheses,
            reorder_cache=backbone.reorder_cache,
            expand_cache=backbone.expand_cache,
            best_extensions=kernels.best_extensions,
            **options,
        )
        scores, found = found[1], ((found[0], found[2]) if with_completion else found[0])  # scores apart
    tokens, complete = found if with_completion else (found, None)
    # Position 0 is the start token, which is the padding id in Marian.
    first = ops.arange(buffer_length) == 0
    outputs = {"decoder_token_ids": tokens, "decoder_padding_mask": (tokens != pad_token_id) | first}
    if num_hypotheses > 1:
        outputs["hypothesis_found"] = scores > search.NEG_INF / 2
    if with_completion:
        outputs["complete"] = complete
    return outputs


def _force_prefix(logits, prefix, forced, position):
    """Where a row's prefix has a token at `position`, every other token of
    `logits` (the scores of that position) gets -inf: the search takes it."""
    token = ops.take(prefix, position, axis=1)
    others = ops.arange(ops.shape(logits)[-1])[None, :] != token[:, None]
    return ops.where(ops.take(forced, position, axis=1)[:, None] & others, search.NEG_INF, logits)


def _with_prefix(step: Callable, prefix, forced, beams: int) -> Callable:
    """`step` whose scores follow each sentence's prefix (one row per beam,
    the beams of a sentence next to each other)."""
    prefix, forced = ops.repeat(prefix, beams, axis=0), ops.repeat(forced, beams, axis=0)

    def prefixed_step(token_ids, index, cache):
        logits, cache = step(token_ids, index, cache)
        return _force_prefix(logits, prefix, forced, index + 1), cache

    return prefixed_step


def search_of(
    backbone: TransformerBackbone,
    settings: SearchSettings,
    with_completion: bool = False,
    num_hypotheses: int = 1,
    kernels: SearchKernels | None = None,
) -> Callable[[dict], dict]:
    """`search_step` of `backbone` with `settings` and `kernels`: a function of the inputs alone."""
    return partial(
        search_step,
        backbone,
        beam_size=settings.beam_size,
        alpha=settings.alpha,
        max_extra_length=settings.max_extra_length,
        with_completion=with_completion,
        num_hypotheses=num_hypotheses,
        kernels=kernels,
    )


def search_with_speed_paths(
    model: keras.Model,
    settings: SearchSettings,
    *,
    jit_compile: bool,
    traced: bool,
    with_completion: bool = False,
    num_hypotheses: int = 1,
    runtime: Runtime | None = None,
) -> Callable[[dict], dict]:
    """`search_of(model.backbone, ...)` with the speed paths `runtime` (by
    default this process's) takes, the layers' attached to `model` and the
    search's own kernels: what every search is built from (`compiled_search`,
    the server's programs).

    Args:
        model: a model with a `backbone`.
        settings, with_completion, num_hypotheses: see `search_step`.
        jit_compile, traced: how the search is compiled
            (`speed_paths.search_kernels.search_kernels`).
        runtime: what the speed paths are chosen from.
    """
    runtime = runtime or describe_runtime()
    # The layers' paths: compiled means XLA (TensorFlow's jit_compile, JAX) or torch.compile.
    compiled = (traced and (jit_compile or runtime.backend == "jax")) or (runtime.backend == "torch" and jit_compile)
    speed_paths.attach(model, runtime, compiled=compiled)
    kernels = search_kernels(runtime, jit_compile=jit_compile, traced=traced)
    return search_of(model.backbone, settings, with_completion, num_hypotheses, kernels)


def compiled_search(
    model: keras.Model,
    jit_compile: bool,
    settings: SearchSettings,
    with_completion: bool = False,
    num_hypotheses: int = 1,
    runtime: Runtime | None = None,
) -> Callable[[dict], dict]:
    """`search_step` on `model.backbone`, with the speed paths `runtime`
    takes, compiled for its backend.

    Args:
        model: a model with a `backbone`; its variables are read at each call
            (on JAX they are passed to the compiled function).
        jit_compile: XLA on TensorFlow; on torch, `torch.compile` of each
            step of the search (`speed_paths.compiled_torch_step`); ignored on JAX.
        settings: the beam size, length penalty and output limit.
        with_completion, num_hypotheses: see `search_step`.
        runtime: the backend the search runs on, and what the speed paths
            are chosen from (by default this process's).
    """
    runtime = runtime or describe_runtime()
    # TensorFlow's `tf.function` and `jax.jit` trace the search into one graph.
    traced = runtime.backend in ("tensorflow", "jax") and not model.run_eagerly
    function = search_with_speed_paths(
        model,
        settings,
        jit_compile=jit_compile,
        traced=traced,
        with_completion=with_completion,
        num_hypotheses=num_hypotheses,
        runtime=runtime,
    )
    if runtime.backend == "torch":
        import torch

        def without_gradients(inputs):
            # The search owns its caches and token buffers: written in place (`in_place_cache_writes`).
            with torch.inference_mode():
                return function(inputs)

        return without_gradients
    if not traced:
        return function
    if runtime.backend == "tensorflow":
        import tensorflow as tf

        # The search is written with `ops.while_loop` and has no Python
        # control flow on tensors: AutoGraph, which would rewrite the source
        # of every function the trace enters, only slows the first call.
        return tf.function(function, jit_compile=jit_compile, autograph=False)
    stateless = jax_stateless_search(model, function)
    return lambda inputs: stateless([v.value for v in model.variables], inputs)


def jax_stateless_search(model: keras.Model, function: Callable[[dict], dict]):
    """`function(inputs)` as a `jax.jit` function of `(values, inputs)`,
    `values` being `model.variables`' values in order: JAX compiles pure
    functions, so the weights are arguments rather than captured state (and
    `.lower(values, inputs).compile()` compiles it ahead of time)."""
    import jax

    variables = model.variables

    @jax.jit
    def stateless(values, inputs):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return function(inputs)

    return stateless
