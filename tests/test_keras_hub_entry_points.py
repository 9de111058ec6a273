"""KerasHub's own entry points on Marian checkpoints, and `generate`'s KerasHub input forms.

The checkpoint is written by `transformers` itself (`save_pretrained` of a
small trained `MarianMTModel` and of its `MarianTokenizer`) and loaded
offline from a huggingface_hub cache, or from its folder. `transformers` and
`torch` are the reference.
"""

import json

import keras_hub
import numpy as np
import pytest
from keras import ops

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
tf = pytest.importorskip("tensorflow")

import keras_transformer as kt  # noqa: E402
from keras_transformer.cli import main as cli  # noqa: E402
from keras_transformer.marian import MarianPreprocessor, MarianPresetLoader, MarianTokenizer  # noqa: E402
from keras_transformer.presets import catalog  # noqa: E402
from keras_transformer.presets.resolution import HubUnreachableError  # noqa: E402
from keras_transformer.utils import library_internals  # noqa: E402
from marian_fixtures import SOURCE_SENTENCES, publish, trained_checkpoint, write_multilingual_repo  # noqa: E402

REPO = "Helsinki-NLP/opus-mt-saved-en-de"
SOURCES = SOURCE_SENTENCES[:3]
PREFIXES = ["Zwei Kinder", "", "Die Katze"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The checkpoint as `save_pretrained` wrote it, and published in a cache."""
    from transformers import MarianTokenizer as ReferenceTokenizer

    root = tmp_path_factory.mktemp("entry_points")
    source_proto, target_proto, vocabulary, model = trained_checkpoint("base")
    inputs = root / "tokenizer_inputs"
    inputs.mkdir()
    # The tokenizer's inputs, as Marian's converter hands them over.
    (inputs / "source.spm").write_bytes(source_proto)
    (inputs / "target.spm").write_bytes(target_proto)
    (inputs / "vocab.json").write_text(json.dumps(vocabulary), "utf-8")
    tokenizer = ReferenceTokenizer(
        source_spm=str(inputs / "source.spm"),
        target_spm=str(inputs / "target.spm"),
        vocab=str(inputs / "vocab.json"),
        source_lang="en",
        target_lang="de",
    )
    folder = root / "checkpoint"
    tokenizer.save_pretrained(str(folder))
    model.save_pretrained(str(folder))
    cache = root / "hub"
    snapshot = publish(folder, cache, REPO)
    return {
        "folder": folder,
        "cache": cache,
        "snapshot": snapshot,
        "handle": f"hf://{REPO}",
        "model": model,
        "tokenizer": ReferenceTokenizer.from_pretrained(str(folder)),
    }


def _offline(patch, cache):
    from huggingface_hub import constants

    patch.setenv("HF_HUB_CACHE", str(cache))
    patch.setenv("HF_HUB_OFFLINE", "1")
    patch.setattr(constants, "HF_HUB_CACHE", str(cache))
    patch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(autouse=True)
def offline(checkpoint, monkeypatch):
    _offline(monkeypatch, checkpoint["cache"])


@pytest.fixture(scope="module")
def task(checkpoint):
    """`keras_hub.models.Seq2SeqLM.from_preset("hf://...")`, loaded once."""
    with pytest.MonkeyPatch.context() as patch:
        _offline(patch, checkpoint["cache"])
        return keras_hub.models.Seq2SeqLM.from_preset(checkpoint["handle"])


def reference_logits(checkpoint, texts=SOURCES, decoder_length=5):
    encoded = checkpoint["tokenizer"](texts, padding=True, return_tensors="np")
    decoder_ids = np.random.default_rng(0).integers(0, len(checkpoint["tokenizer"]) - 1, (len(texts), decoder_length))
    with torch.no_grad():
        expected = checkpoint["model"](
            input_ids=torch.tensor(encoded["input_ids"]),
            attention_mask=torch.tensor(encoded["attention_mask"]),
            decoder_input_ids=torch.tensor(decoder_ids),
        ).logits.numpy()
    inputs = {
        "encoder_token_ids": encoded["input_ids"].astype("int32"),
        "encoder_padding_mask": encoded["attention_mask"].astype("int32"),
        "decoder_token_ids": decoder_ids.astype("int32"),
        "decoder_padding_mask": np.ones_like(decoder_ids, "int32"),
    }
    return inputs, expected


def reference_greedy(checkpoint, texts, prefixes, new_tokens=30) -> list[str]:
    """transformers' greedy translations continuing each target prefix."""
    tokenizer, model = checkpoint["tokenizer"], checkpoint["model"]
    translations = []
    for text, prefix in zip(texts, prefixes):
        source = tokenizer([text], return_tensors="pt")
        prefix_ids = tokenizer(text_target=prefix, add_special_tokens=False)["input_ids"]
        prompt = [model.config.decoder_start_token_id, *prefix_ids]
        with torch.no_grad():
            output = model.generate(
                **source,
                decoder_input_ids=torch.tensor([prompt]),
                num_beams=1,
                do_sample=False,
                max_new_tokens=new_tokens,
            )
        translations.append(tokenizer.decode(output[0], skip_special_tokens=True))
    return translations


# --- Loading through KerasHub's converter mechanism ---------------------------


def test_seq2seqlm_from_preset_builds_this_projects_classes(task, checkpoint):
    assert type(task) is kt.Transformer
    assert type(task.preprocessor) is MarianPreprocessor and type(task.preprocessor.tokenizer) is MarianTokenizer
    inputs, expected = reference_logits(checkpoint)
    np.testing.assert_allclose(ops.convert_to_numpy(task(inputs)), expected, atol=1e-4, rtol=0)


def test_backbone_from_preset_builds_the_same_backbone(task, checkpoint):
    for preset in (checkpoint["handle"], str(checkpoint["folder"])):
        backbone = keras_hub.models.Backbone.from_preset(preset)
        assert type(backbone) is kt.TransformerBackbone
        assert {**backbone.get_config(), "name": None} == {**task.backbone.get_config(), "name": None}
        for ours, theirs in zip(backbone.weights, task.backbone.weights):
            np.testing.assert_array_equal(ops.convert_to_numpy(ours), ops.convert_to_numpy(theirs))


def test_tokenizer_and_preprocessor_from_preset(checkpoint):
    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(checkpoint["handle"])
    assert type(tokenizer) is MarianTokenizer
    expected = checkpoint["tokenizer"](SOURCES, add_special_tokens=False)["input_ids"]
    assert [list(ids) for ids in tokenizer(SOURCES)] == expected
    preprocessor = keras_hub.models.Seq2SeqLMPreprocessor.from_preset(checkpoint["handle"], encoder_sequence_length=24)
    assert type(preprocessor) is MarianPreprocessor and preprocessor.encoder_sequence_length == 24


def test_revisions_load_through_keras_hub(checkpoint):
    model = keras_hub.models.Seq2SeqLM.from_preset(
        checkpoint["handle"], revision=checkpoint["snapshot"].name, load_weights=False
    )
    assert type(model) is kt.Transformer
    with pytest.raises(HubUnreachableError, match="not in the local cache"):
        keras_hub.models.Seq2SeqLM.from_preset(checkpoint["handle"], revision="f" * 40)


def test_transformer_from_preset_takes_the_registered_loader(checkpoint, monkeypatch):
    """`Transformer.from_preset` knows no Marian: KerasHub picks the loader by model type."""
    calls = []

    class RecordingLoader(MarianPresetLoader):
        def load_task(self, cls, *args, **kwargs):
            calls.append((self.preset, cls))
            return super().load_task(cls, *args, **kwargs)

    monkeypatch.setitem(library_internals.TRANSFORMERS_LOADERS, "marian", RecordingLoader)
    model = kt.Transformer.from_preset(str(checkpoint["folder"]), load_weights=False, dtype="float16")
    assert calls == [(str(checkpoint["folder"]), kt.Transformer)]
    assert model.backbone.dtype_policy.name == "float16"


def test_transformers_checkpoint_of_another_model_type_is_refused(checkpoint, tmp_path):
    folder = tmp_path / "bart"
    folder.mkdir()
    config = json.loads((checkpoint["folder"] / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "bart"}))
    with pytest.raises(ValueError) as error:
        kt.Transformer.from_preset(str(folder))
    message = str(error.value)
    assert str(folder) in message and "model_type" in message and "'bart'" in message and "'marian'" in message
    assert message.count(". ") == 0, "one sentence"


def test_hub_repo_not_cached_reports_the_unreachable_hub():
    with pytest.raises(HubUnreachableError, match="could not be reached"):
        kt.Transformer.from_preset("hf://Helsinki-NLP/opus-mt-not-cached")


def test_seq2seqlm_from_preset_on_a_shipped_preset():
    model = keras_hub.models.Seq2SeqLM.from_preset("multi30k_en_de")
    assert type(model) is kt.Transformer
    assert "Hunde" in model.translate("Two dogs play in the snow.", beam_size=None).split()


# --- generate's KerasHub input forms ------------------------------------------


def test_decoder_text_is_a_target_prefix_the_translation_continues(task, checkpoint):
    inputs = {"encoder_text": SOURCES, "decoder_text": PREFIXES}
    translations = task.generate(inputs, beam_size=None, max_extra_length=30)
    assert translations == reference_greedy(checkpoint, SOURCES, PREFIXES)
    assert all(t.startswith(prefix) for t, prefix in zip(translations, PREFIXES))
    assert translations[1] == task.generate(SOURCES[1], beam_size=None, max_extra_length=30)
    assert translations[0] != task.generate(SOURCES[0], beam_size=None, max_extra_length=30)
    # KerasHub's strip_prompt leaves the prefix out.
    stripped = task.generate(inputs, beam_size=None, max_extra_length=30, strip_prompt=True)
    assert stripped[1] == translations[1] and not stripped[0].startswith(PREFIXES[0])
    assert all(t.replace(" ", "") == (p + s).replace(" ", "") for t, p, s in zip(translations, PREFIXES, stripped))
    # Beam search continues the prefix too.
    beams = task.generate(inputs, beam_size=3)
    assert all(t.startswith(prefix) for t, prefix in zip(beams, PREFIXES))


def test_a_packed_prompt_continues_as_text_does(task):
    """KerasHub's generate_preprocess output (source and prompt) as token ids."""
    packed = task.preprocessor.generate_preprocess(
        {"encoder_text": SOURCES, "decoder_text": PREFIXES}, encoder_sequence_length=32, decoder_sequence_length=32
    )
    bare = kt.Transformer(task.backbone)
    outputs = bare.generate(packed, beam_size=None, max_extra_length=30)
    texts = [t.decode() if isinstance(t, bytes) else t for t in task.preprocessor.generate_postprocess(outputs)]
    assert texts == task.generate(
        {"encoder_text": SOURCES, "decoder_text": PREFIXES}, beam_size=None, max_extra_length=30
    )
    # strip_prompt: the start token, then only what the search added.
    stripped = bare.generate(packed, beam_size=None, max_extra_length=30, strip_prompt=True)
    prompt_mask = ops.convert_to_numpy(packed["decoder_padding_mask"])
    for row, prefix_length in enumerate(prompt_mask.sum(axis=1) - 1):
        kept = outputs["decoder_token_ids"][row, 1 + prefix_length :]
        assert stripped["decoder_token_ids"][row, 0] == task.backbone.start_token_id
        np.testing.assert_array_equal(stripped["decoder_token_ids"][row, 1 : 1 + len(kept)], kept)


def test_generate_takes_datasets(task):
    # Batches of the test above's shapes: its compiled searches serve.
    options = dict(beam_size=None, max_extra_length=30)
    strings = tf.data.Dataset.from_tensor_slices(SOURCES).batch(3)
    assert task.generate(strings, **options) == task.generate(SOURCES, **options)
    texts = tf.data.Dataset.from_tensor_slices({"encoder_text": SOURCES, "decoder_text": PREFIXES}).batch(3)
    assert task.generate(texts, **options) == task.generate(
        {"encoder_text": SOURCES, "decoder_text": PREFIXES}, **options
    )
    # Token ids in: one dict of arrays out, as wide as the widest batch.
    bare = kt.Transformer(task.backbone)
    packed = task.preprocessor.pack_sources([[5, 6, 7], [8, 9, 10, 11, 12]])
    ids = tf.data.Dataset.from_tensor_slices(packed).batch(1)
    together = bare.generate(ids, **options)
    assert together["decoder_token_ids"].shape[0] == 2
    for row in range(2):
        alone = bare.generate({key: value[row : row + 1] for key, value in packed.items()}, **options)
        for key in alone:
            np.testing.assert_array_equal(together[key][row : row + 1], alone[key])


@pytest.mark.parametrize(
    "inputs, error, match",
    [
        ({"source": ["A dog."]}, ValueError, r"generate\(\) takes .*encoder_text.*got a dict with keys \['source'\]"),
        ({"encoder_text": ["A dog.", "A cat."], "decoder_text": ["Ein"]}, ValueError, "one target prefix per source"),
        ({"encoder_token_ids": np.ones((1, 3), "int32")}, ValueError, "encoder_padding_mask"),
        (7, TypeError, r"generate\(\) takes .*got int"),
        (["A dog.", 7], TypeError, "inputs item 1 must be a string"),
    ],
)
def test_wrong_input_forms_say_what_generate_takes(task, inputs, error, match):
    with pytest.raises(error, match=match):
        task.generate(inputs, beam_size=None)


# --- The catalog's names -------------------------------------------------------

HUB_NAMES = sorted(name for name, entry in catalog.NAMED_PRESETS.items() if entry["kaggle_handle"].startswith("hf://"))
# The presets of a multilingual checkpoint, by the target language each fixes.
FIXED_LANGUAGES = catalog.PRESET_TARGET_LANGUAGES
MULTILINGUAL_HANDLE = "hf://Helsinki-NLP/opus-mt-tc-big-gmw-gmw"
ENTRY_POINTS = {
    "Backbone": keras_hub.models.Backbone,
    "Tokenizer": keras_hub.models.Tokenizer,
    "Seq2SeqLMPreprocessor": keras_hub.models.Seq2SeqLMPreprocessor,
    "Seq2SeqLM": keras_hub.models.Seq2SeqLM,
    "Transformer": kt.Transformer,
}


@pytest.fixture(scope="module")
def catalog_repos(checkpoint, tmp_path_factory):
    """Every repository the catalog names, published in the cache: the
    multilingual checkpoint as the West Germanic one, the test checkpoint as
    the others. Returns each name's `config.json`."""
    multilingual = write_multilingual_repo(tmp_path_factory.mktemp("catalog") / "multilingual")
    configs = {}
    for name in HUB_NAMES:
        handle = catalog.NAMED_PRESETS[name]["kaggle_handle"]
        folder = multilingual["folder"] if handle == MULTILINGUAL_HANDLE else checkpoint["folder"]
        snapshot = publish(folder, checkpoint["cache"], handle.removeprefix("hf://"))
        configs[name] = json.loads((snapshot / "config.json").read_text())
    return configs


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
@pytest.mark.parametrize("name", HUB_NAMES)
def test_every_entry_point_takes_the_catalog_names(catalog_repos, name, entry_point):
    loaded = ENTRY_POINTS[entry_point].from_preset(name)
    config = catalog_repos[name]
    backbone = getattr(loaded, "backbone", loaded)
    if isinstance(backbone, kt.TransformerBackbone):
        assert type(backbone) is kt.TransformerBackbone
        assert backbone.vocabulary_size == config["vocab_size"]
    tokenizer = getattr(getattr(loaded, "preprocessor", loaded), "tokenizer", loaded)
    if isinstance(tokenizer, MarianTokenizer):
        assert tokenizer.vocabulary_size() == config["vocab_size"]
        assert tokenizer.target_language == FIXED_LANGUAGES.get(name)
    if isinstance(loaded, kt.Transformer):
        assert type(loaded.preprocessor) is MarianPreprocessor


@pytest.mark.parametrize("name", sorted(FIXED_LANGUAGES))
def test_a_fixed_language_holds_through_keras_hub_and_every_saved_copy(catalog_repos, name, tmp_path):
    expected = kt.Transformer.from_preset(MULTILINGUAL_HANDLE).translate(
        SOURCES, target_language=FIXED_LANGUAGES[name], beam_size=None
    )
    model = keras_hub.models.Seq2SeqLM.from_preset(name)
    assert model.translate(SOURCES, beam_size=None) == expected
    model.save_to_preset(str(tmp_path / "saved"))
    assert cli.main(["convert", name, str(tmp_path / "converted")]) == 0
    for folder in ("saved", "converted"):
        for entry_point in (kt.Transformer, keras_hub.models.Seq2SeqLM):
            again = entry_point.from_preset(str(tmp_path / folder))
            assert again.preprocessor.tokenizer.target_language == FIXED_LANGUAGES[name]
        assert again.translate(SOURCES, beam_size=None) == expected


def test_evaluate_takes_the_target_language_apart_from_the_references_language(catalog_repos, tmp_path):
    translations = kt.Transformer.from_preset(MULTILINGUAL_HANDLE).translate(
        SOURCES, target_language="nld", beam_size=2
    )
    (tmp_path / "test.en").write_text("".join(s + "\n" for s in SOURCES), "utf-8")
    # References without a language suffix: their language is named.
    (tmp_path / "references.txt").write_text("".join(t + "\n" for t in translations), "utf-8")
    arguments = ["--src", str(tmp_path / "test.en"), "--ref", str(tmp_path / "references.txt"), "--beam-size", "2"]
    arguments += ["--lowercase-tokenized", "--json", str(tmp_path / "scores.json"), "--quiet"]
    code = cli.main(
        ["evaluate", MULTILINGUAL_HANDLE, "--target-language", "nld", "--reference-language", "nl", *arguments]
    )
    assert code == 0
    scores = json.loads((tmp_path / "scores.json").read_text("utf-8"))
    assert scores["target_language"] == "nld" and scores["reference_language"] == "nl"
    assert scores["bleu"] == pytest.approx(100) and scores["lc_tok_bleu"] == pytest.approx(100)
    assert scores["lc_tok_preprocessing"] == "lowercase+moses-norm+moses-tok(nl)"
