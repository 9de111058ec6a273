"""`Transformer`: the trainable, translating task model."""

import contextlib
import gc
import os

import keras
import keras_hub

from keras_transformer.generation.decoding import resolve_jit_compile
from keras_transformer.generation.settings import beam_size_of
from keras_transformer.models.search_cache import SearchCache
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.models.transformer_fitting import TransformerFitting
from keras_transformer.models.transformer_generation import TransformerGeneration
from keras_transformer.models.transformer_preprocessor import TransformerPreprocessor
from keras_transformer.presets.integrity import load_preset_weights
from keras_transformer.presets.resolution import check_hub_reachable, preset_handle, resolve_preset
from keras_transformer.presets.saving import save_preset
from keras_transformer.training import LabelSmoothedCrossEntropy, MaskedAccuracy, TrainingRecipe, paper_optimizer
from keras_transformer.utils.library_internals import HF_PREFIX, TRANSFORMERS_LOADERS, preset_config


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(TransformerGeneration, TransformerFitting, keras_hub.models.Seq2SeqLM):
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
        self._search_cache = SearchCache()

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
                `decoding.resolve_jit_compile`); on torch, eager, and
                `jit_compile=True` puts each step of the searches through
                `torch.compile` (`decoding.compiled_search`): 1.1-1.8x as
                fast, after 5-31 s of compiling per batch shape.
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
        beam_size_of(sampler)  # refuse an unknown sampler before anything changes
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
        self._search_cache = SearchCache(jit_compile)

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
        self._search_cache = SearchCache(self._search_cache.jit_compile)
        self.generate_function = None
        self.train_function = self.test_function = self.predict_function = None


@contextlib.contextmanager
def _older_objects_left_out_of_collections():
    """Garbage collections inside skip the objects that exist before (`gc.freeze`).

    Keras runs a full collection for every float weight `quantize` replaces
    (`Layer.__delattr__`), each one slow with TensorFlow's objects in memory:
    frozen, they are skipped (`benchmarks/RESULTS.md`, "Why the code takes these paths").
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
