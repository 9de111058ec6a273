"""Marian checkpoints through KerasHub's own `from_preset`.

`keras_transformer.marian` registers `MarianPresetLoader` with KerasHub for
`transformers` checkpoints of model type `"marian"`, so KerasHub's entry
points build this package's classes from an Opus-MT repository or a
`save_pretrained` folder, converter chosen by `config.json`'s `model_type`:

- `keras_hub.models.Seq2SeqLM.from_preset(...)` (and
  `keras_transformer.Transformer.from_preset`): a `Transformer` with a
  `MarianPreprocessor`;
- `keras_hub.models.Backbone.from_preset(...)`: a `TransformerBackbone`;
- `keras_hub.models.Seq2SeqLMPreprocessor.from_preset(...)` and
  `keras_hub.tokenizers.Tokenizer.from_preset(...)`: a `MarianPreprocessor`
  and a `MarianTokenizer`.

Each takes an `hf://` handle, a folder, or a registered name that stands
for a Hub repo (`"base_en_de"`, `keras_transformer.presets.catalog`), and
`revision=` (a branch, tag or commit of a Hub repo); files come from
huggingface_hub's cache first (`keras_transformer.marian.hub`). A name that
fixes a target language (`"big_en_de"`: German) gives a tokenizer with that
`target_language`, which its saved configuration keeps.

Example:
>>> import keras_hub, keras_transformer
>>> model = keras_hub.models.Seq2SeqLM.from_preset("hf://Helsinki-NLP/opus-mt-en-de")  # doctest: +SKIP
>>> type(model).__name__  # doctest: +SKIP
'Transformer'
"""

from keras_transformer.marian.hub import CheckpointFiles
from keras_transformer.marian.loader import marian_backbone, marian_preprocessor
from keras_transformer.marian.preprocessor import MarianPreprocessor
from keras_transformer.marian.tokenizer import MarianTokenizer
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.presets.resolution import preset_target_language
from keras_transformer.utils.library_internals import PresetLoader


class MarianPresetLoader(PresetLoader):
    """KerasHub's loader for a Marian checkpoint in `transformers` format.

    Args:
        preset: `hf://org/name`, a registered name that stands for one, or
            a folder.
        config: its `config.json`, as KerasHub read it (the main revision);
            the checkpoint's files, config included, are read again at the
            `revision` a call names.
    """

    def check_backbone_class(self) -> type[TransformerBackbone]:
        return TransformerBackbone

    def load_backbone(self, cls, load_weights: bool, revision: str | None = None, **kwargs) -> TransformerBackbone:
        files = CheckpointFiles(self.preset, revision)
        tokenizer = marian_preprocessor(files).tokenizer
        return marian_backbone(files, tokenizer, load_weights, backbone_cls=cls, **kwargs)

    def load_tokenizer(self, cls, config_file=None, revision: str | None = None) -> MarianTokenizer:
        return self._preprocessor(CheckpointFiles(self.preset, revision)).tokenizer

    def load_preprocessor(self, cls, config_file=None, revision: str | None = None, **kwargs) -> MarianPreprocessor:
        # A task or preprocessor class asks for its own preprocessor class;
        # a Marian checkpoint needs Marian's packing and two SentencePiece models.
        return self._preprocessor(CheckpointFiles(self.preset, revision), **kwargs)

    def load_task(self, cls, load_weights: bool, load_task_weights: bool, revision: str | None = None, **kwargs):
        # The output projection is the shared embedding: there are no task weights.
        files = CheckpointFiles(self.preset, revision)
        # The config and the tokenizer files are checked before any weights are read.
        preprocessor = self._preprocessor(files)
        if "backbone" not in kwargs:
            backbone_kwargs, kwargs = self.get_backbone_kwargs(**kwargs)
            kwargs["backbone"] = marian_backbone(
                files, preprocessor.tokenizer, load_weights, backbone_cls=cls.backbone_cls, **backbone_kwargs
            )
        kwargs.setdefault("preprocessor", preprocessor)
        return cls(**kwargs)

    def _preprocessor(self, files: CheckpointFiles, **kwargs) -> MarianPreprocessor:
        """The checkpoint's preprocessor, its tokenizer set to the target
        language the preset's name fixes, if any."""
        preprocessor = marian_preprocessor(files, **kwargs)
        preprocessor.tokenizer.set_target_language(preset_target_language(self.preset))
        return preprocessor
