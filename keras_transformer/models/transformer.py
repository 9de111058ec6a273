"""`Transformer`: the trainable, translating task model."""

import warnings
from functools import partial

import keras
import keras_hub
import numpy as np
from keras import ops

from keras_transformer import preset_utils
from keras_transformer.models import search
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.models.transformer_preprocessor import TransformerPreprocessor
from keras_transformer.sentences import split_sentences
from keras_transformer.training import (
    LabelSmoothedCrossEntropy,
    MaskedAccuracy,
    TransformerSchedule,
)

TOKEN_ID_KEYS = ("encoder_token_ids", "encoder_padding_mask", "decoder_token_ids")
SOURCE_BUCKET = 16  # source lengths are padded to a multiple of this: few shapes, few compiles
TOO_LONG_POLICIES = ("split", "truncate", "error")
PROGRESS_MIN_BATCHES = 3  # translate() shows a progress bar beyond this many batches
WORD_START = "\u2581"  # SentencePiece's "▁", which begins a piece that begins a word


def paper_optimizer(hidden_dim: int, warmup_steps: int = 4000, scale: float = 1.0, **kwargs):
    """Adam(beta1=0.9, beta2=0.98, eps=1e-9) on the section 5.3 schedule."""
    return keras.optimizers.Adam(
        learning_rate=TransformerSchedule(hidden_dim, warmup_steps, scale),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        **kwargs,
    )


def resolve_jit_compile(jit_compile: bool | str = "auto") -> bool:
    """`"auto"` means XLA on TensorFlow and JAX, whatever the device.

    Keras resolves `jit_compile="auto"` to False for TensorFlow on a machine
    without a GPU, so training and decoding ran uncompiled on CPUs; measured
    here, XLA makes base-size training about 1.7x and beam search about 2.4x
    faster on CPU too. On torch, "auto" stays eager (`torch.compile` is
    opt-in with `jit_compile=True`).
    """
    if jit_compile != "auto":
        return bool(jit_compile)
    return keras.config.backend() in ("tensorflow", "jax")


def check_search_arguments(beam_size: int | None, alpha: float, max_extra_length: int) -> None:
    """Raises a `ValueError` naming the first bad decoding argument."""
    if beam_size is not None and (not isinstance(beam_size, int) or beam_size < 1):
        raise ValueError(f"beam_size must be a positive integer or None; got {beam_size!r}.")
    # The early stop compares finished scores with the best a live beam can
    # still reach, log P / lp(max length); that bound needs lp to grow with
    # length, i.e. alpha >= 0.
    if not alpha >= 0:
        raise ValueError(f"alpha (the length penalty exponent) must be >= 0; got {alpha!r}.")
    if not isinstance(max_extra_length, int) or max_extra_length < 0:
        raise ValueError(f"max_extra_length must be an integer >= 0; got {max_extra_length!r}.")


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras_hub.models.Seq2SeqLM):
    """The Transformer translation model of "Attention Is All You Need".

    A KerasHub `Seq2SeqLM`: a `TransformerBackbone`, logits from the shared
    embedding matrix (section 3.4), and an optional `TransformerPreprocessor`
    so that `fit`, `evaluate` and `translate` take raw strings.

    `compile()` with no arguments is the paper's recipe: Adam(0.9, 0.98, 1e-9)
    with the warmup / inverse square-root schedule (5.3), label smoothing 0.1
    (5.4), and token accuracy, all ignoring padding.

    `translate()` / `generate()` decode with beam search (beam 4, length
    penalty alpha 0.6, at most source length + 50 tokens, section 6.1) or
    greedily, with cached keys and values, compiled as one graph per
    (batch, length bucket) shape.

    Args:
        backbone: a `TransformerBackbone`.
        preprocessor: a `TransformerPreprocessor`, or `None` to feed token ids.

    Example:
    >>> import keras_transformer as kt
    >>> pairs = [("a dog runs .", "ein hund rennt ."), ("a cat .", "eine katze .")]
    >>> tokenizer = kt.train_tokenizer([s for p in pairs for s in p] * 10, 40)
    >>> model = kt.Transformer(
    ...     backbone=kt.TransformerBackbone(
    ...         vocabulary_size=tokenizer.vocabulary_size(), num_encoder_layers=1,
    ...         num_decoder_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32),
    ...     preprocessor=kt.TransformerPreprocessor(tokenizer, 16, 16))
    >>> history = model.fit(
    ...     {"encoder_text": [p[0] for p in pairs], "decoder_text": [p[1] for p in pairs]},
    ...     batch_size=2, epochs=1, verbose=0)
    >>> len(model.translate(["a dog runs ."]))
    1
    """

    backbone_cls = TransformerBackbone
    preprocessor_cls = TransformerPreprocessor

    def __init__(self, backbone: TransformerBackbone, preprocessor=None, **kwargs):
        if preprocessor is not None:
            _check_special_ids(backbone, preprocessor.tokenizer)
        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor

        # === Functional model ===
        inputs = backbone.input
        hidden = backbone(inputs)["decoder_sequence_output"]
        logits = backbone.token_embedding(hidden, reverse=True)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self._search_functions = {}

    def compile(
        self,
        optimizer="auto",
        loss="auto",
        *,
        weighted_metrics="auto",
        label_smoothing: float = 0.1,
        warmup_steps: int = 4000,
        **kwargs,
    ):
        """Configures training; every `"auto"` is the paper's choice.

        Args:
            optimizer: `"auto"` for Adam(0.9, 0.98, 1e-9) on
                `TransformerSchedule(hidden_dim, warmup_steps)`, or any Keras
                optimizer.
            loss: `"auto"` for `LabelSmoothedCrossEntropy(label_smoothing)`.
            weighted_metrics: `"auto"` for `MaskedAccuracy`.
            label_smoothing: eps_ls for the `"auto"` loss.
            warmup_steps: for the `"auto"` optimizer.
            **kwargs: passed to `keras.Model.compile`. `jit_compile="auto"`
                (the default) means XLA on TensorFlow and JAX, on every
                device (see `resolve_jit_compile`).
        """
        backbone = self.backbone
        if optimizer == "auto":
            optimizer = paper_optimizer(backbone.hidden_dim, warmup_steps)
        if loss == "auto":
            loss = LabelSmoothedCrossEntropy(
                label_smoothing,
                pad_token_id=backbone.pad_token_id,
                unsmoothed_ids=(backbone.pad_token_id, backbone.start_token_id, backbone.unk_token_id),
            )
        if weighted_metrics == "auto":
            weighted_metrics = [MaskedAccuracy(pad_token_id=backbone.pad_token_id)]
        # KerasHub's Seq2SeqLM.compile adds a sampler; decoding here is the
        # paper's beam search, so go straight to keras.Model.compile.
        keras.Model.compile(
            self,
            optimizer=optimizer,
            loss=loss,
            weighted_metrics=weighted_metrics,
            jit_compile=resolve_jit_compile(kwargs.pop("jit_compile", "auto")),
            **kwargs,
        )
        self._search_functions = {}

    @classmethod
    def from_preset(cls, preset, load_weights: bool = True, **kwargs):
        """Loads a preset: a registered name, an `hf://org/name` handle or a folder.

        Hub presets are read from huggingface_hub's cache first. Every file is
        checked against the SHA-256 recorded when it was saved, and configs
        may only name Keras, KerasHub and keras-transformer classes, before
        anything is built (see `keras_transformer.preset_utils`). With
        `load_weights=False`, a paper preset (`"base_en_de"`, ...) builds
        offline from this package's copy of its config; without its
        vocabulary it has no preprocessor (with a warning).

        Args:
            preset: see `keras_transformer.preset_utils.available_presets()`.
            load_weights: load the saved weights, or initialise randomly.
            **kwargs: passed to KerasHub, e.g. `dtype="float16"`; weights
                saved in float16 load as float32 unless `dtype` is given.
        """
        directory, architecture_only = preset_utils.resolve_preset(preset, load_weights)
        if architecture_only:
            kwargs["preprocessor"] = None
        model = super().from_preset(str(directory), load_weights=False, **kwargs)
        if load_weights:
            preset_utils.load_preset_weights(model.backbone, directory)
        return model

    def save_to_preset(self, preset_dir, max_shard_size=10, *, weights_dtype=None, model_card=None):
        """Saves a preset atomically, with checksums and a model card.

        See `keras_transformer.preset_utils.save_preset`; `weights_dtype=
        "float16"` halves the weights file.
        """
        preset_utils.save_preset(
            self, preset_dir, max_shard_size, weights_dtype=weights_dtype, model_card=model_card
        )

    def preprocess_samples(self, x, y=None, sample_weight=None):
        # Token ids (e.g. from `keras_transformer.data`) skip the preprocessor.
        if isinstance(x, dict) and all(key in x for key in TOKEN_ID_KEYS):
            return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        return super().preprocess_samples(x, y, sample_weight)

    # --- Decoding -------------------------------------------------------

    def search_step(
        self,
        inputs: dict,
        beam_size: int | None = 4,
        alpha: float = 0.6,
        max_extra_length: int = 50,
    ):
        """Decodes one batch of token ids; traceable as a single graph.

        Args:
            inputs: `encoder_token_ids`, `encoder_padding_mask` (`(batch,
                source_length)`) and `decoder_token_ids`, whose static length is
                the output buffer, start token included.
            beam_size: beams per sentence, or `None` for greedy search.
            alpha: length penalty exponent for beam search.
            max_extra_length: each sentence gets at most its source length
                (its tokens other than the start and end tokens) plus this
                many tokens before its end token (section 6.1).

        The special ids are the backbone's.

        Returns:
            `{"decoder_token_ids", "decoder_padding_mask"}`: the translations
            as token ids, start and end tokens included.
        """
        backbone = self.backbone
        source_ids = inputs["encoder_token_ids"]
        source_mask = inputs["encoder_padding_mask"]
        batch, source_length = ops.shape(source_ids)[0], ops.shape(source_ids)[1]
        buffer_length = ops.shape(inputs["decoder_token_ids"])[1]

        start_token_id, end_token_id = backbone.start_token_id, backbone.end_token_id
        pad_token_id = backbone.pad_token_id
        encoder_output = backbone.encode(source_ids, source_mask)
        # Source tokens without start and end tokens (whichever packing the
        # tokenizer uses), plus the paper's 50, plus the end token.
        is_text = ops.cast(source_mask, "bool") & (source_ids != start_token_id) & (source_ids != end_token_id)
        source_tokens = ops.sum(ops.cast(is_text, "int32"), axis=-1)
        max_lengths = source_tokens + max_extra_length + 1

        start = ops.full((batch, 1), start_token_id, dtype="int32")
        logits, self_cache, cross_cache = backbone.decode_step(
            start,
            0,
            encoder_output,
            source_mask,
            backbone.empty_cache(batch, buffer_length),
            backbone.empty_cache(batch, source_length),
            fill_cross_attention_cache=True,
        )
        first_log_probs = ops.log_softmax(ops.cast(logits[:, 0, :], "float32"))
        if beam_size is not None:
            # Every beam of a sentence reads the same source.
            encoder_output, source_mask, cross_cache = (
                ops.repeat(t, beam_size, axis=0) for t in (encoder_output, source_mask, cross_cache)
            )

        def step(token_ids, index, cache):
            logits, cache, _ = backbone.decode_step(
                token_ids, index, encoder_output, source_mask, cache, cross_cache
            )
            return ops.log_softmax(ops.cast(logits[:, 0, :], "float32")), cache

        special = dict(
            start_token_id=start_token_id, end_token_id=end_token_id, pad_token_id=pad_token_id
        )
        if beam_size is None:
            tokens = search.greedy_search(
                step, first_log_probs, self_cache, max_lengths, buffer_length, **special
            )
        else:
            tokens, _ = search.beam_search(
                step, first_log_probs, self_cache, max_lengths, buffer_length,
                beam_size, alpha, **special,
            )
        return {"decoder_token_ids": tokens, "decoder_padding_mask": tokens != pad_token_id}

    @property
    def _search_jit_compile(self) -> bool:
        """XLA for decoding on TensorFlow unless `compile(jit_compile=False)`."""
        return self.jit_compile if self.compiled else resolve_jit_compile()

    def _search_function(self, **config):
        """`search_step` compiled for the backend, one per search config."""
        key = tuple(sorted(config.items()))
        if key in self._search_functions:
            return self._search_functions[key]
        function = partial(self.search_step, **config)
        backend = keras.config.backend()
        if backend == "tensorflow" and not self.run_eagerly:
            import tensorflow as tf

            function = tf.function(function, jit_compile=self._search_jit_compile)
        elif backend == "jax" and not self.run_eagerly:
            import jax

            variables = self.variables

            @jax.jit
            def stateless(values, inputs):
                with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                    return self.search_step(inputs, **config)

            def function(inputs):
                return stateless([v.value for v in variables], inputs)

        elif backend == "torch":
            import torch

            def function(inputs, _search=function):
                with torch.no_grad():
                    return _search(inputs)

        self._search_functions[key] = function
        return function

    def generate(
        self,
        inputs,
        max_length: int | None = None,
        *,
        beam_size: int | None = 4,
        alpha: float = 0.6,
        max_extra_length: int = 50,
    ):
        """Translates one batch.

        Args:
            inputs: a string or list of strings (with a preprocessor), or a dict
                of `encoder_token_ids` and `encoder_padding_mask` arrays.
            max_length: the output buffer, start token included; by default
                the padded source length + `max_extra_length`, so that no
                sentence is cut short of section 6.1's limit.
            beam_size: beams per sentence (4 in the paper); `None` for greedy
                search. `beam_size=1` with `alpha=0` is greedy search too.
            alpha: length penalty exponent, 0.6 in the paper.
            max_extra_length: at most source length + this many tokens.

        Returns:
            Strings (with a preprocessor; one string for one string in), or
            `{"decoder_token_ids", "decoder_padding_mask"}` arrays.
        """
        check_search_arguments(beam_size, alpha, max_extra_length)
        single = isinstance(inputs, str)
        if single:
            inputs = [inputs]
        if isinstance(inputs, dict):
            token_ids = {k: ops.convert_to_numpy(inputs[k]) for k in TOKEN_ID_KEYS[:2]}
        else:
            if self.preprocessor is None:
                raise ValueError(
                    "This model has no preprocessor, so generate() needs token ids: "
                    "a dict with 'encoder_token_ids' and 'encoder_padding_mask'."
                )
            token_ids = self._pack_sources(self._tokenize(list(inputs)))
        source_length = token_ids["encoder_token_ids"].shape[1]
        if max_length is None:
            max_length = source_length + max_extra_length
        batch = token_ids["encoder_token_ids"].shape[0]
        token_ids["decoder_token_ids"] = np.zeros((batch, max_length), "int32")
        function = self._search_function(
            beam_size=beam_size, alpha=float(alpha), max_extra_length=max_extra_length
        )
        outputs = function({k: ops.convert_to_tensor(v) for k, v in token_ids.items()})
        outputs = {k: ops.convert_to_numpy(v) for k, v in outputs.items()}
        if self.preprocessor is None:
            return outputs
        texts = self.preprocessor.generate_postprocess(outputs)
        texts = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in _to_list(texts)]
        return texts[0] if single else texts

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        ids = self.preprocessor.tokenizer(texts)
        return [list(row) for row in _to_list(ids)]

    def translate(
        self,
        texts,
        *,
        beam_size: int | None = 4,
        alpha: float = 0.6,
        max_extra_length: int = 50,
        batch_size: int = 32,
        too_long: str = "split",
        verbose: int | str = "auto",
    ) -> list[str] | str:
        """Translates sentences, in batches of similar length.

        Inputs are checked before anything runs, and a bad item is named by
        its index. An empty or whitespace-only string (precisely: one with no
        tokens) translates to `""` without running the model. `bytes` are
        decoded as UTF-8.

        The longest source the model takes is `min(backbone.max_sequence_length,
        preprocessor.encoder_sequence_length) - 2` tokens (`<s>` and `</s>`
        take two). A longer input follows `too_long`, never silently:

        - `"split"` (default): cut it into sentences (see
          `keras_transformer.sentences.split_sentences`), a sentence that is
          still too long into pieces of at most that many tokens (at word
          starts where possible), translate the parts and join them with
          spaces;
        - `"truncate"`: keep its first tokens, with a warning that counts the
          inputs cut;
        - `"error"`: raise a `ValueError` naming the first such input.

        However many texts come in, at most `batch_size` sentences are decoded
        at a time, so memory stays bounded.

        Args:
            texts: a string, or a list (any iterable) of strings.
            beam_size, alpha, max_extra_length: see `generate`.
            batch_size: sentences decoded together (beams multiply this).
            too_long: `"split"`, `"truncate"` or `"error"`, see above.
            verbose: `"auto"` shows a `keras.utils.Progbar` when there are more
                than a few batches, 1 always, 0 never.

        Returns:
            The translations, in the order of `texts` (a string for a string).

        Raises:
            TypeError: `texts` or one of its items is not a string (or bytes).
            ValueError: an item is not valid UTF-8, or is too long with
                `too_long="error"`.
        """
        if too_long not in TOO_LONG_POLICIES:
            raise ValueError(f"too_long must be one of {TOO_LONG_POLICIES}; got {too_long!r}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer; got {batch_size}.")
        if self.preprocessor is None:
            raise ValueError("translate() needs a model with a preprocessor; use generate() with token ids.")
        single = isinstance(texts, (str, bytes))
        texts = _check_texts([texts] if single else texts)
        room = self.max_source_tokens
        if room < 1:
            raise ValueError(
                f"This model takes sources of at most {room} tokens: raise the "
                "preprocessor's encoder_sequence_length or the backbone's max_sequence_length."
            )
        token_ids = self._tokenize(texts) if texts else []

        # Each input becomes one or more segments of at most `room` tokens.
        segments = []  # (input index, token ids)
        too_long_inputs = [i for i, ids in enumerate(token_ids) if len(ids) > room]
        if too_long_inputs and too_long == "error":
            first = too_long_inputs[0]
            raise ValueError(
                f"texts[{first}] has {len(token_ids[first])} tokens, more than the {room} this "
                f"model takes ({len(too_long_inputs)} input(s) are too long); pass "
                "too_long='split' or too_long='truncate'."
            )
        if too_long_inputs and too_long == "truncate":
            warnings.warn(
                f"{len(too_long_inputs)} input(s) longer than {room} tokens were truncated to "
                f"{room} tokens (texts[{too_long_inputs[0]}] first); too_long='split' "
                "translates them whole.",
                stacklevel=2,
            )
        for index, ids in enumerate(token_ids):
            if len(ids) <= room:
                parts = [ids] if ids else []
            elif too_long == "truncate":
                parts = [ids[:room]]
            else:
                parts = self._split_for_translation(texts[index], room)
            segments.extend((index, part) for part in parts)

        order = sorted(range(len(segments)), key=lambda s: len(segments[s][1]))
        num_batches = -(-len(segments) // batch_size)
        if verbose == "auto":
            verbose = int(num_batches > PROGRESS_MIN_BATCHES)
        progress = keras.utils.Progbar(len(segments), verbose=verbose, unit_name="sentence")
        outputs = [""] * len(segments)
        for start in range(0, len(segments), batch_size):
            batch = order[start : start + batch_size]
            translations = self.generate(
                self._pack_sources([segments[s][1] for s in batch]),
                beam_size=beam_size,
                alpha=alpha,
                max_extra_length=max_extra_length,
            )
            for s, text in zip(batch, translations):
                outputs[s] = text
            progress.add(len(batch))

        results = [[] for _ in texts]
        for (index, _), text in zip(segments, outputs):
            results[index].append(text)
        results = [" ".join(t for t in parts if t) for parts in results]
        return results[0] if single else results

    @property
    def max_source_tokens(self) -> int:
        """The longest source `translate` takes whole, in tokens (<s> </s> left out)."""
        limit = self.backbone.max_sequence_length
        if self.preprocessor is not None and self.preprocessor.encoder_sequence_length:
            limit = min(limit, self.preprocessor.encoder_sequence_length)
        return limit - 2

    def _split_for_translation(self, text: str, room: int) -> list[list[int]]:
        """Token ids of the sentences of `text`, too long ones cut to `room`."""
        vocabulary = None
        parts = []
        for ids in self._tokenize(split_sentences(text)):
            while len(ids) > room:
                vocabulary = vocabulary or self.preprocessor.tokenizer.get_vocabulary()
                cut = _word_start_before(ids, room, vocabulary)
                parts.append(ids[:cut])
                ids = ids[cut:]
            if ids:
                parts.append(ids)
        return parts

    def _pack_sources(self, rows: list[list[int]]) -> dict:
        """`<s> ids </s> <pad>...`, padded to the next multiple of SOURCE_BUCKET,
        as the preprocessor packs sources."""
        tokenizer = self.preprocessor.tokenizer
        longest = max((len(ids) for ids in rows), default=0) + 2
        bucket = -(-longest // SOURCE_BUCKET) * SOURCE_BUCKET
        token_ids = np.full((len(rows), bucket), tokenizer.pad_token_id, "int32")
        for row, ids in enumerate(rows):
            token_ids[row, : len(ids) + 2] = [tokenizer.start_token_id, *ids, tokenizer.end_token_id]
        lengths = np.array([len(ids) + 2 for ids in rows])
        mask = np.arange(bucket)[None, :] < lengths[:, None]
        return {"encoder_token_ids": token_ids, "encoder_padding_mask": mask}


def _check_special_ids(backbone: TransformerBackbone, tokenizer) -> None:
    """The tokenizer and the backbone must agree on the special ids."""
    # A tokenizer being deserialized gets its vocabulary (and ids) later.
    pairs = {
        name: (getattr(backbone, name), getattr(tokenizer, name, None))
        for name in ("pad_token_id", "start_token_id", "end_token_id")
    }
    differ = {name: ids for name, ids in pairs.items() if ids[1] is not None and ids[0] != ids[1]}
    if differ:
        raise ValueError(
            "The backbone and the tokenizer disagree on special token ids "
            f"(name: (backbone, tokenizer)): {differ}. Build the backbone with the "
            "tokenizer's ids."
        )


def _word_start_before(ids: list[int], room: int, vocabulary: list[str]) -> int:
    """Where to cut `ids` into at most `room` tokens: the last word start in
    the second half of the window, or `room` if there is none. Cutting a
    word's subwords apart would garble that word."""
    for cut in range(room, room // 2, -1):
        if vocabulary[ids[cut]].startswith(WORD_START):
            return cut
    return room


def _check_texts(texts) -> list[str]:
    """`texts` as a list of str: bytes decoded, anything else named by index."""
    if texts is None or isinstance(texts, dict) or not hasattr(texts, "__iter__"):
        raise TypeError(
            "translate() argument 'texts' must be a string or a list of strings; "
            f"got {type(texts).__name__}."
        )
    checked = []
    for index, text in enumerate(texts):
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"translate() argument 'texts' item {index} is not valid UTF-8 "
                    f"({error.reason} at byte {error.start})."
                ) from None
        if not isinstance(text, str):
            raise TypeError(
                f"translate() argument 'texts' item {index} must be a string; "
                f"got {type(text).__name__}."
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            # Lone surrogates, e.g. from a file read with errors="surrogateescape".
            raise ValueError(
                f"translate() argument 'texts' item {index} cannot be encoded as UTF-8 "
                f"({error.reason} at character {error.start})."
            ) from None
        checked.append(str(text))
    return checked


def _to_list(x):
    """A tensor, ragged tensor or array as nested Python lists."""
    if hasattr(x, "to_list"):
        return x.to_list()
    if hasattr(x, "numpy"):
        x = x.numpy()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return list(x)
