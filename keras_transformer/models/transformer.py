"""`Transformer`: the trainable, translating task model."""

import contextlib
import gc
from functools import partial

import keras
import keras_hub
import numpy as np
from keras import ops

from keras_transformer import marian
from keras_transformer.layers.threefry_dropout import xla_compiled
from keras_transformer.generation.decoding import check_search_arguments, compiled_search, resolve_jit_compile
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.models.transformer_preprocessor import TransformerPreprocessor
from keras_transformer.generation.translation import to_list, tokenize, translate_texts
from keras_transformer.presets.integrity import load_preset_weights
from keras_transformer.presets.resolution import preset_handle, resolve_preset
from keras_transformer.presets.saving import save_preset
from keras_transformer.training import LabelSmoothedCrossEntropy, MaskedAccuracy, paper_optimizer

TOKEN_ID_KEYS = ("encoder_token_ids", "encoder_padding_mask", "decoder_token_ids")
PAPER_BEAM_SIZE = 4  # section 6.1
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
        label_smoothing: float = 0.1,
        warmup_steps: int = 4000,
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
                device (see `decoding.resolve_jit_compile`).
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
        # KerasHub's Seq2SeqLM.compile only adds a sampler, which is handled
        # here (the paper's beam search is not one of KerasHub's samplers).
        keras.Model.compile(
            self,
            optimizer=optimizer,
            loss=loss,
            weighted_metrics=weighted_metrics,
            jit_compile=resolve_jit_compile(kwargs.pop("jit_compile", "auto")),
            **kwargs,
        )
        self.sampler = sampler
        self._search_functions = SearchFunctions()

    @classmethod
    def from_preset(cls, preset, load_weights: bool = True, **kwargs):
        """Loads a preset: a registered name, an `hf://org/name` handle or a folder.

        A `transformers` checkpoint (a `config.json` with a `model_type`,
        e.g. `"hf://Helsinki-NLP/opus-mt-en-de"`) is converted on load; only
        Marian (Opus-MT) is supported, see `keras_transformer.marian`.

        Hub presets are read from huggingface_hub's cache first. Every file is
        checked against the SHA-256 recorded when it was saved, and configs
        may only name Keras, KerasHub and keras-transformer classes, before
        anything is built (see `keras_transformer.presets.integrity`). With
        `load_weights=False`, the paper's architectures (`"transformer_base"`,
        `"transformer_big"`, and `"big_en_de"` when its Hub repo cannot be
        reached) build offline from this package's copy of their config,
        without a preprocessor.

        Args:
            preset: see `keras_transformer.presets.resolution.available_presets()`.
            load_weights: load the saved weights, or initialise randomly.
            **kwargs: passed to KerasHub, e.g. `dtype="float16"`; weights
                saved in float16 load as float32 unless `dtype` is given.
                `revision=` names a branch, tag or commit of a Hub repo in
                `transformers` format.
        """
        handle = preset_handle(preset)
        revision = kwargs.pop("revision", None)
        if marian.is_transformers_checkpoint(handle, revision):
            backbone, preprocessor = marian.load_marian(
                handle, load_weights, revision=revision, dtype=kwargs.pop("dtype", None)
            )
            return cls(backbone=backbone, preprocessor=preprocessor, **kwargs)
        directory, architecture_only = resolve_preset(preset, load_weights)
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
        save_preset(
            self, preset_dir, max_shard_size, weights_dtype=weights_dtype, model_card=model_card
        )

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
        self._search_functions = SearchFunctions()
        self.generate_function = None
        self.train_function = self.test_function = self.predict_function = None

    def preprocess_samples(self, x, y=None, sample_weight=None):
        # Token ids (e.g. from `keras_transformer.training.data`) skip the preprocessor.
        if isinstance(x, dict) and all(key in x for key in TOKEN_ID_KEYS):
            return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        return super().preprocess_samples(x, y, sample_weight)

    def train_step(self, *args, **kwargs):
        # Traced into Keras' training function, which XLA compiles when
        # `jit_compile` is on: dropout masks may then use Threefry
        # (`layers.threefry_dropout`; about 7% of a tiny-model step).
        with xla_compiled(self.jit_compile):
            return super().train_step(*args, **kwargs)

    def make_train_function(self, force: bool = False):
        # Without a distribution strategy, Keras' TensorFlow trainer leaves the
        # optimizer unbuilt until the first traced step creates its variables,
        # and a `tf.function` that creates variables is traced twice. Built
        # here, it is traced once: the first `fit` call of the tiny benchmark
        # model 30.0 -> 17.9 s (TensorFlow + XLA, 2 threads). Keras builds it
        # the same way itself on JAX, PyTorch and under a strategy.
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(self.trainable_variables)
        return super().make_train_function(force)

    # --- Decoding -------------------------------------------------------

    def _search_function(
        self, beam_size: int | None, alpha: float, max_extra_length: int, with_completion: bool = False
    ):
        """The compiled search for one configuration, cached."""
        key = (beam_size, alpha, max_extra_length, with_completion)
        functions = self._search_functions.functions
        if key not in functions:
            # XLA on TensorFlow unless compile(jit_compile=False) said otherwise.
            jit_compile = self.jit_compile if self.compiled else resolve_jit_compile()
            functions[key] = compiled_search(
                self, jit_compile, beam_size=beam_size, alpha=alpha,
                max_extra_length=max_extra_length, with_completion=with_completion,
            )
        return functions[key]

    def make_generate_function(self):
        """The compiled search of `compile(sampler=...)` (KerasHub's API):
        `{"encoder_token_ids", "encoder_padding_mask", "decoder_token_ids"}`
        arrays in, `{"decoder_token_ids", "decoder_padding_mask"}` out."""
        self.generate_function = self._search_function(_beam_size_of(self.sampler), 0.6, 50)
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
        beam_size: int | None | str = "auto",
        alpha: float = 0.6,
        max_extra_length: int = 50,
    ):
        """Translates one batch.

        Args:
            inputs: a string or list of strings (with a preprocessor), or a dict
                of `encoder_token_ids` and `encoder_padding_mask` arrays.
            max_length: the output buffer, start token included; by default
                the padded source length + `max_extra_length`, so that no
                sentence is cut short of section 6.1's limit (searched first
                with a shorter buffer, and again only if a sentence did not
                finish within it: the same translations, faster).
            stop_token_ids: KerasHub's argument; `"auto"`, `None` or the
                backbone's end token (the search stops there and only there).
            strip_prompt: KerasHub's argument; translations have no decoder
                prompt, so there is nothing to strip.
            beam_size: beams per sentence (4 in the paper); `None` for greedy
                search; `"auto"` for `compile(sampler=...)`'s choice (beam 4
                before `compile`). `beam_size=1` with `alpha=0` is greedy too.
            alpha: length penalty exponent, 0.6 in the paper.
            max_extra_length: at most source length + this many tokens.

        Returns:
            Strings (with a preprocessor; one string for one string in), or
            `{"decoder_token_ids", "decoder_padding_mask"}` arrays.
        """
        _check_stop_token_ids(self.backbone, stop_token_ids)
        if beam_size == "auto":
            beam_size = _beam_size_of(self.sampler)
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
            token_ids = self.preprocessor.pack_sources(tokenize(self.preprocessor.tokenizer, list(inputs)))
        search = partial(self._search, token_ids, beam_size, float(alpha), max_extra_length)
        source_length = token_ids["encoder_token_ids"].shape[1]
        outputs = None
        if max_length is None:
            max_length = source_length + max_extra_length
            if source_length + FIRST_BUFFER_EXTRA < max_length:
                outputs = search(source_length + FIRST_BUFFER_EXTRA, with_completion=True)
                if outputs.pop("complete").all():
                    outputs = _widen(outputs, max_length, self.backbone.pad_token_id)
                else:
                    outputs = None
        if outputs is None:
            outputs = search(max_length)
        if self.preprocessor is None:
            return outputs
        texts = self.preprocessor.generate_postprocess(outputs)
        texts = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in to_list(texts)]
        return texts[0] if single else texts

    def _search(
        self, token_ids: dict, beam_size, alpha, max_extra_length, buffer_length, with_completion=False
    ) -> dict:
        """One search of a batch with an output buffer of `buffer_length`."""
        batch = token_ids["encoder_token_ids"].shape[0]
        inputs = {**token_ids, "decoder_token_ids": np.zeros((batch, buffer_length), "int32")}
        function = self._search_function(beam_size, alpha, max_extra_length, with_completion)
        outputs = function({k: ops.convert_to_tensor(v) for k, v in inputs.items()})
        return {k: ops.convert_to_numpy(v) for k, v in outputs.items()}

    def translate(
        self,
        texts,
        *,
        beam_size: int | None | str = "auto",
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
        return translate_texts(
            self,
            texts,
            beam_size=beam_size,
            alpha=alpha,
            max_extra_length=max_extra_length,
            batch_size=batch_size,
            too_long=too_long,
            verbose=verbose,
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
    (`Layer.__delattr__`); with TensorFlow's objects in memory that took 25 s
    for the tiny benchmark model's 64 kernels here, 0.56 s with them frozen.
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


def _widen(outputs: dict, length: int, pad_token_id: int) -> dict:
    """Search outputs padded to `length` positions, as a full buffer gives them."""
    extra = ((0, 0), (0, length - outputs["decoder_token_ids"].shape[1]))
    return {
        "decoder_token_ids": np.pad(outputs["decoder_token_ids"], extra, constant_values=pad_token_id),
        "decoder_padding_mask": np.pad(outputs["decoder_padding_mask"], extra, constant_values=False),
    }


class SearchFunctions:
    """The compiled searches of a model, by (beam size, alpha, max extra length).

    Not a `dict`: Keras and TensorFlow track dicts set on a model, and the
    SavedModel writer would then try to save these functions (and fail on
    the tuple keys); a plain object is left alone.
    """

    def __init__(self):
        self.functions = {}


def _beam_size_of(sampler) -> int | None:
    """The beam size a `compile(sampler=...)` value stands for."""
    if sampler == "beam":
        return PAPER_BEAM_SIZE
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
