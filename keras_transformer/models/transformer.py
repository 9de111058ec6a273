"""`Transformer`: the trainable, translating task model."""

import contextlib
import gc
import math
import os
from functools import partial

import keras
import keras_hub
import numpy as np
from keras import ops

from keras_transformer.generation.batches import (
    concatenate,
    is_dataset,
    pack_prompts,
    prompt_positions,
    strip_prefixes,
    target_token_ids,
    text_batch,
    token_id_batch,
    widen,
)
from keras_transformer.generation.decoding import compiled_search, resolve_jit_compile
from keras_transformer.generation.settings import SearchSettings
from keras_transformer.generation.translation import to_list, tokenize, translate_texts, with_target_language
from keras_transformer.layers.threefry_dropout import xla_compiled
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.models.transformer_preprocessor import TransformerPreprocessor
from keras_transformer.presets.integrity import load_preset_weights
from keras_transformer.presets.resolution import check_hub_reachable, preset_handle, resolve_preset
from keras_transformer.presets.saving import save_preset
from keras_transformer.training import LabelSmoothedCrossEntropy, MaskedAccuracy, TrainingRecipe, paper_optimizer
from keras_transformer.utils.library_internals import HF_PREFIX, TRANSFORMERS_LOADERS, preset_config
from keras_transformer.utils.text_libraries import tf

TOKEN_ID_KEYS = ("encoder_token_ids", "encoder_padding_mask", "decoder_token_ids")
# Sentences end long before section 6.1's source + 50 limit (Multi30k: 13 to
# 36 tokens), and every search step reads the whole output buffer. So
# `generate` first searches with a buffer this much longer than the padded
# source, and searches again with the full buffer only if a sentence was not
# finished within it.
FIRST_BUFFER_EXTRA = 16


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
    (batch, length bucket) shape (`keras_transformer.generation.decoding`).
    `compile(sampler="greedy")` (or a KerasHub `GreedySampler` /
    `BeamSampler`) changes the default search, as in KerasHub.

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
        logits = backbone.logits(hidden)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self.sampler = "beam"
        self._search_functions = SearchFunctions()

    def compile(
        self,
        optimizer="auto",
        loss="auto",
        *,
        weighted_metrics="auto",
        sampler="beam",
        label_smoothing: float = TrainingRecipe.label_smoothing,
        warmup_steps: int = TrainingRecipe.warmup_steps,
        **kwargs,
    ):
        """Configures training and decoding; every `"auto"` is the paper's choice.

        Args:
            optimizer: `"auto"` for Adam(0.9, 0.98, 1e-9) on
                `TransformerSchedule(hidden_dim, warmup_steps)`, or any Keras
                optimizer.
            loss: `"auto"` for `LabelSmoothedCrossEntropy(label_smoothing)`.
            weighted_metrics: `"auto"` for `MaskedAccuracy`.
            sampler: the default search of `generate` and `translate`:
                `"beam"` (the paper's beam 4), `"greedy"`, or KerasHub's
                `GreedySampler()` / `BeamSampler(num_beams=k)`. Sampling
                samplers are refused: section 6.1 searches, it does not sample.
            label_smoothing: eps_ls for the `"auto"` loss.
            warmup_steps: for the `"auto"` optimizer.
            **kwargs: passed to `keras.Model.compile`. `jit_compile="auto"`
                (the default) means XLA on TensorFlow and JAX, on every
                device, except training a bfloat16 model on TensorFlow on a
                CPU with bfloat16 instructions (see
                `decoding.resolve_jit_compile`).
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
        _beam_size_of(sampler)  # refuse an unknown sampler before anything changes
        jit_compile = kwargs.pop("jit_compile", "auto")
        # KerasHub's Seq2SeqLM.compile only adds a sampler, which is handled
        # here (the paper's beam search is not one of KerasHub's samplers).
        keras.Model.compile(
            self,
            optimizer=optimizer,
            loss=loss,
            weighted_metrics=weighted_metrics,
            jit_compile=resolve_jit_compile(jit_compile, backbone.compute_dtype),
            **kwargs,
        )
        self.sampler = sampler
        self._search_functions = SearchFunctions(jit_compile)

    @classmethod
    def from_preset(cls, preset, load_weights: bool = True, **kwargs):
        """Loads a preset: a registered name, an `hf://org/name` handle or a folder.

        A `transformers` checkpoint (a `config.json` with a `model_type`,
        e.g. `"hf://Helsinki-NLP/opus-mt-en-de"`) is converted on load by
        the loader KerasHub picks for its model type, as
        `keras_hub.models.Seq2SeqLM.from_preset` does; this package registers
        Marian (Opus-MT), see `keras_transformer.marian`.

        Hub presets are read from huggingface_hub's cache first. Every file is
        checked against the SHA-256 recorded when it was saved, and configs
        may only name Keras, KerasHub and keras-transformer classes, before
        anything is built (see `keras_transformer.presets.integrity`). With
        `load_weights=False`, the paper's architectures (`"transformer_base"`,
        `"transformer_big"`) build offline from this package's copy of their
        config, without a preprocessor. Presets of a multilingual checkpoint
        fix its target language (`"big_en_de"`: German, `"big_de_en"`:
        English; see `translate`).

        Args:
            preset: see `keras_transformer.presets.resolution.available_presets()`.
            load_weights: load the saved weights, or initialise randomly.
            **kwargs: passed to KerasHub, e.g. `dtype="float16"`; weights
                saved in float16 load as float32 unless `dtype` is given.
                `revision=` names a branch, tag or commit of a Hub repo in
                `transformers` format (its model type is read from the main
                revision's `config.json`).
        """
        check_hub_reachable(preset)
        handle = preset_handle(preset)
        model_type = _transformers_model_type(handle)
        if model_type is not None:
            if model_type not in TRANSFORMERS_LOADERS:
                known = ", ".join(repr(name) for name in TRANSFORMERS_LOADERS)
                raise ValueError(
                    f"Cannot load {handle}: config.json has model_type = {model_type!r}, but Transformer "
                    f"loads transformers checkpoints of model type {known} only."
                )
            # A registered name, not its handle: the loader sets the language the name fixes.
            return super().from_preset(
                preset if isinstance(preset, str) else handle, load_weights=load_weights, **kwargs
            )
        revision = kwargs.pop("revision", None)
        directory, architecture_only = resolve_preset(preset, load_weights)
        if revision is not None:
            raise ValueError(
                f"revision={revision!r} names a version of a checkpoint in transformers format, and "
                f"{preset} is a KerasHub preset: load it without a revision."
            )
        if architecture_only:
            kwargs["preprocessor"] = None
        model = super().from_preset(str(directory), load_weights=False, **kwargs)
        if load_weights:
            load_preset_weights(model.backbone, directory)
        return model

    def save_to_preset(self, preset_dir, max_shard_size=10, *, weights_dtype=None, model_card=None):
        """Saves a preset atomically, with checksums and a model card.

        See `keras_transformer.presets.saving.save_preset`; `weights_dtype=
        "float16"` halves the weights file.
        """
        save_preset(self, preset_dir, max_shard_size, weights_dtype=weights_dtype, model_card=model_card)

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Quantizes the backbone's weights (`keras.Model.quantize`), e.g.
        `model.quantize("int8")` for int8 inference; searches compiled before
        are dropped, so the next one uses the quantized layers.

        Only the backbone has weights: `keras.Model.quantize` on the whole
        task would also visit the preprocessor's tokenizer, which Keras
        refuses as an unbuilt layer.
        """
        with _older_objects_left_out_of_collections():
            self.backbone.quantize(mode, config=config, filters=filters, **kwargs)
        self._search_functions = SearchFunctions(self._search_functions.jit_compile)
        self.generate_function = None
        self.train_function = self.test_function = self.predict_function = None

    def preprocess_samples(self, x, y=None, sample_weight=None):
        # Token ids (e.g. from `keras_transformer.training.data`) skip the preprocessor.
        if isinstance(x, dict) and all(key in x for key in TOKEN_ID_KEYS):
            return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        return super().preprocess_samples(x, y, sample_weight)

    def fit(
        self,
        x=None,
        y=None,
        batch_size=None,
        sample_weight=None,
        validation_data=None,
        validation_split=None,
        shuffle=True,
        **kwargs,
    ):
        """KerasHub's `fit`, with array-like inputs reshuffled every epoch, as
        Keras shuffles arrays.

        KerasHub batches lists and arrays (of strings or token ids, in dicts
        and tuples) in their order into a dataset, which Keras then cannot
        shuffle; here their examples are shuffled anew each epoch unless
        `shuffle=False`. `validation_split` holds out the last examples
        before shuffling, as Keras does. Datasets are passed on as they are,
        and so is everything on a machine without TensorFlow (which has no
        `tf.data` to shuffle with).
        """
        if not shuffle or tf is None or not _is_array_like(x):
            return super().fit(
                x, y, batch_size, sample_weight, validation_data, validation_split, shuffle=shuffle, **kwargs
            )
        examples = _examples(keras.utils.pack_x_y_sample_weight(x, y, sample_weight))
        if validation_split and validation_data is None:
            examples, validation = _split_off_validation(examples, validation_split)
            validation_data = validation.batch(batch_size or 32)
        elif _is_array_like(validation_data):
            validation_data = _examples(validation_data).batch(batch_size or 32)
        batches = examples.shuffle(len(examples), reshuffle_each_iteration=True).batch(batch_size or 32)
        # Shuffled already: Keras would only warn that it cannot shuffle a dataset.
        return super().fit(batches, validation_data=validation_data, shuffle=False, **kwargs)

    def train_step(self, *args, **kwargs):
        # Traced into Keras' training function, which XLA compiles when
        # `jit_compile` is on: dropout masks may then use Threefry
        # (`layers.threefry_dropout`), faster on a CPU than Philox.
        with xla_compiled(self.jit_compile):
            return super().train_step(*args, **kwargs)

    def make_train_function(self, force: bool = False):
        # Without a distribution strategy, Keras' TensorFlow trainer leaves the
        # optimizer unbuilt until the first traced step creates its variables,
        # and a `tf.function` that creates variables is traced twice. Built
        # here, it is traced once, which shortens the first `fit` call by a
        # third or more. Keras builds it the same way itself on JAX, PyTorch
        # and under a strategy.
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(self.trainable_variables)
        return super().make_train_function(force)

    # --- Decoding -------------------------------------------------------

    def _search_function(self, settings: SearchSettings, with_completion: bool = False):
        """The compiled search for one configuration, cached."""
        key = (settings, with_completion)
        functions = self._search_functions.functions
        if key not in functions:
            # XLA on TensorFlow unless compile(jit_compile=False) said otherwise
            # (whatever training chose for a bfloat16 model).
            jit_compile = resolve_jit_compile(self._search_functions.jit_compile)
            functions[key] = compiled_search(self, jit_compile, settings, with_completion)
        return functions[key]

    @property
    def compiled_searches(self) -> dict:
        """The searches compiled so far, by `(SearchSettings, with_completion)`."""
        return dict(self._search_functions.functions)

    def forget_compiled_searches(self) -> None:
        """Drops the compiled searches: the next `generate` traces its search
        anew, e.g. after the layers' code changed."""
        self._search_functions = SearchFunctions(self._search_functions.jit_compile)

    @property
    def default_search(self) -> SearchSettings:
        """The search of `generate` and `translate` when none is given:
        section 6.1's, with `compile(sampler=...)`'s beam size."""
        return SearchSettings(beam_size=_beam_size_of(self.sampler))

    def _search_settings(self, search, beam_size, alpha, max_extra_length) -> SearchSettings:
        """`search` (by default `default_search`) with the fields given as arguments."""
        return (search or self.default_search).overridden(
            beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length
        )

    def make_generate_function(self):
        """The compiled search of `compile(sampler=...)` (KerasHub's API):
        `{"encoder_token_ids", "encoder_padding_mask", "decoder_token_ids"}`
        arrays in (with a `decoder_padding_mask`, the decoder ids are a
        prompt the search continues, as `generate_preprocess` packs it),
        `{"decoder_token_ids", "decoder_padding_mask"}` out."""
        self.generate_function = self._search_function(self.default_search)
        return self.generate_function

    def generate_step(self, inputs: dict, stop_token_ids=None) -> dict:
        """One batch through the search of `compile(sampler=...)` (KerasHub's
        API); the search always stops at the backbone's end token."""
        _check_stop_token_ids(self.backbone, stop_token_ids)
        return self.make_generate_function()(inputs)

    def generate(
        self,
        inputs,
        max_length: int | None = None,
        stop_token_ids="auto",
        strip_prompt: bool = False,
        *,
        search: SearchSettings | None = None,
        beam_size: int | None | str = "auto",
        alpha: float | None = None,
        max_extra_length: int | None = None,
        target_language: str | None = None,
    ):
        """Translates one batch.

        Args:
            inputs: a string or list of strings (with a preprocessor);
                KerasHub's `{"encoder_text": [...], "decoder_text": [...]}`,
                whose decoder text is a forced target prefix (the
                translation continues it, as CTranslate2's `target_prefix`);
                a dict of `encoder_token_ids` and `encoder_padding_mask`
                arrays, optionally with a prompt (`decoder_token_ids` and
                `decoder_padding_mask`: the start token and a prefix); or a
                `tf.data.Dataset` of batches of these, whose outputs come
                back together. See `keras_transformer.generation.batches`.
            max_length: the output buffer, start token included; by default
                the padded source length + `max_extra_length`, so that no
                sentence is cut short of section 6.1's limit (searched first
                with a shorter buffer, and again only if a sentence did not
                finish within it: the same translations, faster).
            stop_token_ids: KerasHub's argument; `"auto"`, `None` or the
                backbone's end token (the search stops there and only there).
            strip_prompt: KerasHub's argument: leave the target prefix out
                of the outputs.
            search: the `SearchSettings` (beam size, length penalty, output
                limit); by default `default_search`, section 6.1's beam
                search with `compile(sampler=...)`'s beam size.
            beam_size: beams per sentence, or `None` for greedy search,
                instead of `search`'s; `"auto"` keeps `search`'s.
            alpha: the length penalty exponent instead of `search`'s.
            max_extra_length: at most source length + this many tokens,
                instead of `search`'s.
            target_language: for a multilingual Opus-MT model, the language
                to translate into (`"deu"`), whose token (`>>deu<<`) is put
                before each text without one; by default the tokenizer's own
                `target_language`. See `translate`.

        Returns:
            Strings (with a preprocessor; one string for one string in), or
            `{"decoder_token_ids", "decoder_padding_mask"}` arrays.
        """
        _check_stop_token_ids(self.backbone, stop_token_ids)
        settings = self._search_settings(search, beam_size, alpha, max_extra_length)
        if is_dataset(inputs):
            results = [
                self.generate(
                    batch, max_length, stop_token_ids, strip_prompt, search=settings, target_language=target_language
                )
                for batch in inputs.as_numpy_iterator()
            ]
            return concatenate(results, self.backbone.pad_token_id)
        texts = text_batch(inputs)
        if texts is None:
            token_ids = token_id_batch(inputs)
        else:
            if self.preprocessor is None:
                raise ValueError(
                    "This model has no preprocessor, so generate() needs token ids: "
                    "a dict with 'encoder_token_ids' and 'encoder_padding_mask'."
                )
            tokenizer = self.preprocessor.tokenizer
            sources = with_target_language(tokenizer, texts.sources, target_language)
            token_ids = self.preprocessor.pack_sources(tokenize(tokenizer, sources))
            if texts.prefixes is not None:
                backbone = self.backbone
                prefixes = target_token_ids(tokenizer, texts.prefixes)
                token_ids.update(pack_prompts(prefixes, backbone.start_token_id, backbone.pad_token_id))
        run_search = partial(self._search, token_ids, settings)
        # The buffer holds the longer of the source and the target prompt (both
        # padded to few widths, so that few searches are compiled), and more.
        prompt_length = token_ids["decoder_token_ids"].shape[1] if "decoder_token_ids" in token_ids else 0
        source_length = max(token_ids["encoder_token_ids"].shape[1], prompt_length)
        outputs = None
        if max_length is None:
            first_buffer, max_length = _default_buffers(source_length, prompt_length, settings)
            if first_buffer is not None:
                outputs = run_search(first_buffer, with_completion=True)
                if outputs.pop("complete").all():
                    outputs = widen(outputs, max_length, self.backbone.pad_token_id)
                else:
                    outputs = None
        elif max_length <= (prefix_positions := prompt_positions(token_ids)):
            raise ValueError(
                f"max_length={max_length} leaves no room after the target prefix ({prefix_positions} positions, "
                "start token included); raise it or leave it out."
            )
        if outputs is None:
            outputs = run_search(max_length)
        if strip_prompt and prompt_length:
            outputs = strip_prefixes(outputs, token_ids["decoder_padding_mask"], self.backbone.pad_token_id)
        if self.preprocessor is None:
            return outputs
        translations = self.preprocessor.generate_postprocess(outputs)
        translations = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in to_list(translations)]
        return translations[0] if texts is not None and texts.single else translations

    def _search(
        self, token_ids: dict, settings: SearchSettings, buffer_length: int, with_completion: bool = False
    ) -> dict:
        """One search of a batch with an output buffer of `buffer_length`."""
        batch = token_ids["encoder_token_ids"].shape[0]
        inputs = {**token_ids, "decoder_token_ids": np.zeros((batch, buffer_length), "int32")}
        if "decoder_padding_mask" in token_ids:  # a target prefix, which the search continues
            # A buffer narrower than the padded prompt leaves out only padding (generate checks it).
            prompt = {key: token_ids[key][:, :buffer_length] for key in ("decoder_token_ids", "decoder_padding_mask")}
            inputs.update(widen(prompt, buffer_length, self.backbone.pad_token_id))
        function = self._search_function(settings, with_completion)
        outputs = function({k: ops.convert_to_tensor(v) for k, v in inputs.items()})
        return {k: ops.convert_to_numpy(v) for k, v in outputs.items()}

    def compile_searches(self, token_ids: dict, search: SearchSettings | None = None) -> None:
        """Compiles, by running them once, the searches `generate(token_ids,
        search=search)` may run for a batch of this shape: the one with the
        short first buffer and the one with the full buffer. A server calls
        this for each shape it decodes before it takes requests.

        Args:
            token_ids: `{"encoder_token_ids", "encoder_padding_mask"}` arrays
                of the batch size and source width to compile for.
            search: the `SearchSettings` (by default `default_search`).
        """
        settings = search or self.default_search
        first_buffer, full_buffer = _default_buffers(token_ids["encoder_token_ids"].shape[1], 0, settings)
        if first_buffer is not None:
            self._search(token_ids, settings, first_buffer, with_completion=True)
        self._search(token_ids, settings, full_buffer)

    def translate(
        self,
        texts,
        *,
        search: SearchSettings | None = None,
        beam_size: int | None | str = "auto",
        alpha: float | None = None,
        max_extra_length: int | None = None,
        batch_size: int = 32,
        too_long: str = "split",
        verbose: int | str = "auto",
        target_language: str | None = None,
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
          `keras_transformer.generation.sentences.split_sentences`), a sentence that is
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
            search, beam_size, alpha, max_extra_length: see `generate`.
            batch_size: sentences decoded together (beams multiply this).
            too_long: `"split"`, `"truncate"` or `"error"`, see above.
            verbose: `"auto"` shows a `keras.utils.Progbar` when there are more
                than a few batches, 1 always, 0 never.
            target_language: for a multilingual Opus-MT model (its
                vocabulary has tokens such as `>>deu<<`), the language to
                translate into, e.g. `"deu"`; by default the tokenizer's
                `target_language` (`big_en_de` fixes German). A text that
                starts with its own token (`">>nld<< ..."`) keeps it, and is
                tokenized as `transformers`' `MarianTokenizer` does.

        Returns:
            The translations, in the order of `texts` (a string for a string).

        Raises:
            TypeError: `texts` or one of its items is not a string (or bytes).
            ValueError: an item is not valid UTF-8, or is too long with
                `too_long="error"`; a multilingual model got no language or
                an unknown one (the message lists its languages); a model of
                one target language got a language.
        """
        return translate_texts(
            self,
            texts,
            search=self._search_settings(search, beam_size, alpha, max_extra_length),
            batch_size=batch_size,
            too_long=too_long,
            verbose=verbose,
            target_language=target_language,
        )

    @property
    def max_source_tokens(self) -> int:
        """The longest source `translate` takes whole, in tokens (<s> </s> left
        out; Marian's sources have no <s>)."""
        limit = self.backbone.max_sequence_length
        if self.preprocessor is not None and self.preprocessor.encoder_sequence_length:
            limit = min(limit, self.preprocessor.encoder_sequence_length)
        return limit - (2 if getattr(self.preprocessor, "source_start_token", True) else 1)


@contextlib.contextmanager
def _older_objects_left_out_of_collections():
    """Garbage collections inside skip the objects that exist before (`gc.freeze`).

    Keras runs a full collection for every float weight `quantize` replaces
    (`Layer.__delattr__`); with TensorFlow's objects in memory each takes a
    sizeable fraction of a second, so quantizing even a tiny model took tens
    of seconds, and well under one with them frozen.
    One collection at the end frees what became garbage. A collector the
    caller froze already is left as it is.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()


def _transformers_model_type(handle) -> str | None:
    """The `model_type` of a checkpoint in `transformers` format (`hf://` or a
    folder); `None` for a KerasHub preset, or when its `config.json` cannot be
    read (then `resolve_preset` says why)."""
    if not isinstance(handle, str) or not (handle.startswith(HF_PREFIX) or os.path.isdir(handle)):
        return None
    try:
        config = preset_config(handle)
    except (OSError, ValueError):
        return None
    return config.get("model_type") if isinstance(config, dict) else None


def _is_array_like(data) -> bool:
    """Lists, tuples, dicts and arrays, which Keras slices and shuffles; not datasets."""
    return isinstance(data, (list, tuple, dict)) or hasattr(data, "__array__")


def _examples(data):
    """`data` (arrays, lists, and dicts or tuples of them) as a `tf.data`
    dataset of examples, converted as KerasHub converts them."""
    leaves = keras.tree.map_structure(
        lambda leaf: ops.convert_to_numpy(leaf) if hasattr(leaf, "__array__") else leaf, data
    )
    return tf.data.Dataset.from_tensor_slices(leaves)


def _split_off_validation(examples, validation_split: float):
    """The first examples to train on and the last `validation_split` of them to validate on."""
    count = len(examples)
    training = math.floor(count * (1.0 - validation_split))
    if training in (0, count):
        raise ValueError(
            f"validation_split={validation_split} of {count} examples leaves none to "
            f"{'train on' if training == 0 else 'validate on'}: give more examples or another split."
        )
    return examples.take(training), examples.skip(training)


class SearchFunctions:
    """The compiled searches of a model, by (beam size, alpha, max extra length).

    Not a `dict`: Keras and TensorFlow track dicts set on a model, and the
    SavedModel writer would then try to save these functions (and fail on
    the tuple keys); a plain object is left alone.
    """

    def __init__(self, jit_compile: bool | str = "auto"):
        self.jit_compile = jit_compile  # as given to `Transformer.compile`
        self.functions = {}


def _default_buffers(source_length: int, prompt_length: int, settings: SearchSettings) -> tuple[int | None, int]:
    """The output buffers `generate` searches with when given no `max_length`:
    the short first one (`None` where it would be no shorter) and the full one."""
    full = max(source_length + settings.max_extra_length, prompt_length + 1)
    first = source_length + FIRST_BUFFER_EXTRA
    return (first if first < full else None), full


def _beam_size_of(sampler) -> int | None:
    """The beam size a `compile(sampler=...)` value stands for."""
    if sampler == "beam":
        return SearchSettings.beam_size
    if sampler == "greedy" or isinstance(sampler, keras_hub.samplers.GreedySampler):
        return None
    if isinstance(sampler, keras_hub.samplers.BeamSampler):
        return sampler.num_beams
    raise ValueError(
        f"Transformer decodes with greedy or beam search (section 6.1); sampler {sampler!r} "
        "is not one of them. Use sampler='beam' (the paper's), 'greedy', "
        "keras_hub.samplers.GreedySampler() or keras_hub.samplers.BeamSampler(num_beams=k)."
    )


def _check_stop_token_ids(backbone: TransformerBackbone, stop_token_ids) -> None:
    if stop_token_ids in ("auto", None):
        return
    if isinstance(stop_token_ids, (list, tuple)) and list(stop_token_ids) == [backbone.end_token_id]:
        return
    raise ValueError(
        f"The search stops at the end token ({backbone.end_token_id}) and only there; got "
        f"stop_token_ids={stop_token_ids!r}. Pass 'auto'."
    )


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
