"""Models leave in `transformers` format: `MarianMTModel`, `MarianTokenizer`
and CTranslate2's converter translate an export as this project does.

Three models: a tiny model of this project's own kind (interleaved
sinusoids, `<s>` before every source, `<pad>` = 0), an Opus-MT-style
checkpoint written by `transformers` and fine-tuned here one step, and the
shipped `multi30k_en_de` preset. Greedy translations are compared as token
ids; `transformers` and `ctranslate2` are test-only dependencies.
"""

import json

import keras
import numpy as np
import pytest
from keras import ops

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import keras_transformer as kt  # noqa: E402
from helpers import make_model  # noqa: E402
from keras_transformer.generation.decoding import search_step  # noqa: E402
from keras_transformer.marian import MarianExportError, export_transformers  # noqa: E402
from marian_fixtures import (  # noqa: E402
    SOURCE_SENTENCES,
    TARGET_SENTENCES,
    VARIANTS,
    make_marian_model,
    make_vocabulary,
    train_sentencepiece,
)

SOURCES = ["A dog runs across the green field.", "Two children play.", "The woman reads a book in the garden."]
NEW_TOKENS = 12


def exported_tokens(folder, texts=SOURCES):
    """`MarianTokenizer.from_pretrained(folder)`'s source ids and mask."""
    from transformers import MarianTokenizer

    encoded = MarianTokenizer.from_pretrained(str(folder))(texts, padding=True, return_tensors="np")
    return encoded["input_ids"].astype("int32"), encoded["attention_mask"].astype("int32")


def cut(row, end: int, length: int) -> list[int]:
    """The first `length` tokens of `row`, up to its first end token."""
    row = [int(token) for token in row]
    return (row[: row.index(end) + 1] if end in row else row)[:length]


def our_greedy(model, ids, mask, length=NEW_TOKENS) -> list[list[int]]:
    """This project's greedy search on the export's token ids. Its padding id
    (its last) may be outside the model's vocabulary: padded positions get
    id 0 instead, which the mask hides as well."""
    backbone = model.backbone
    inputs = {
        "encoder_token_ids": np.where(mask == 1, ids, 0).astype("int32"),
        "encoder_padding_mask": mask,
        "decoder_token_ids": np.zeros((len(ids), ids.shape[1] + length + 1), "int32"),
    }
    outputs = search_step(
        backbone, {k: ops.convert_to_tensor(v) for k, v in inputs.items()}, beam_size=None, max_extra_length=length
    )
    return [cut(row[1:], backbone.end_token_id, length) for row in ops.convert_to_numpy(outputs["decoder_token_ids"])]


def transformers_greedy(folder, ids, mask, end, length=NEW_TOKENS) -> list[list[int]]:
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        outputs = model.generate(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            num_beams=1,
            do_sample=False,
            max_new_tokens=length,
            forced_eos_token_id=None,
        ).numpy()
    return [cut(row[1:], end, length) for row in outputs]


def ctranslate2_greedy(folder, ids, mask, end, tmp_path, length=NEW_TOKENS) -> list[list[int]]:
    """CTranslate2's converter and greedy search; its outputs leave out the end token."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from transformers import MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(str(folder))
    converted = ctranslate2.converters.TransformersConverter(str(folder)).convert(str(tmp_path / "ct2"))
    translator = ctranslate2.Translator(converted, device="cpu", intra_threads=1)
    sources = [tokenizer.convert_ids_to_tokens(row[row_mask == 1].tolist()) for row, row_mask in zip(ids, mask)]
    # min_decoding_length=0: CTranslate2 would otherwise forbid </s> as the first token.
    results = translator.translate_batch(sources, beam_size=1, max_decoding_length=length, min_decoding_length=0)
    return [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]


def log_probabilities(logits) -> np.ndarray:
    return ops.convert_to_numpy(ops.log_softmax(ops.convert_to_tensor(logits, "float32"), axis=-1))


def assert_same_translations(model, folder, tmp_path, texts=SOURCES, length=NEW_TOKENS, ended=0):
    ids, mask = exported_tokens(folder, texts)
    end = model.backbone.end_token_id
    ours = our_greedy(model, ids, mask, length)
    assert transformers_greedy(folder, ids, mask, end, length) == ours
    assert ctranslate2_greedy(folder, ids, mask, end, tmp_path, length) == [
        [token for token in row if token != end] for row in ours
    ]
    assert sum(row[-1] == end for row in ours) >= ended, "too few translations ended"


# --- This project's own kind of model -------------------------------------------


@pytest.fixture
def own_model(tokenizer):
    """Interleaved sinusoids, `<s>` before sources, `<pad>` = 0; epsilon 1e-5 as Marian's."""
    keras.utils.set_random_seed(11)
    return make_model(tokenizer, layer_norm_epsilon=1e-5)


@pytest.mark.slow
def test_own_model_translates_the_same_in_transformers_and_ctranslate2(own_model, tmp_path):
    folder = export_transformers(own_model, tmp_path / "export")
    assert own_model.backbone.position_encoding_layout == "interleaved"
    texts = ["a dog runs .", "two cats play ."]
    ids, mask = exported_tokens(folder, texts)
    # MarianTokenizer packs sources as this project does: <s> ids </s>.
    ours = ops.convert_to_numpy(own_model.preprocessor.generate_preprocess(texts)["encoder_token_ids"])
    for row, row_mask, our_row in zip(ids, mask, ours):
        assert row[row_mask == 1].tolist() == [t for t in our_row.tolist() if t != own_model.backbone.pad_token_id]
    assert_same_translations(own_model, folder, tmp_path, texts)


def test_own_model_logits_equal_up_to_a_constant_per_position(own_model, tmp_path):
    """The rewrites (sinusoid order, zero start row) leave every log-probability unchanged."""
    from transformers import MarianMTModel

    folder = export_transformers(own_model, tmp_path / "export")
    ids, mask = exported_tokens(folder, ["a dog runs .", "two cats play ."])
    backbone = own_model.backbone
    targets = np.array([[backbone.start_token_id, 5, 9, 7], [backbone.start_token_id, 6, 8, 10]], "int32")
    ours = ops.convert_to_numpy(
        own_model(
            {
                "encoder_token_ids": np.where(mask == 1, ids, backbone.pad_token_id),
                "encoder_padding_mask": mask,
                "decoder_token_ids": targets,
                "decoder_padding_mask": np.ones_like(targets),
            }
        )
    )
    exported_targets = targets.copy()
    exported_targets[:, 0] = backbone.vocabulary_size  # the export's decoder start: its new last <pad>
    marian = MarianMTModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        theirs = marian(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            decoder_input_ids=torch.tensor(exported_targets),
        ).logits.numpy()
    # Over the tokens either model can generate (the export never emits <s> or either <pad>).
    generated = [
        i for i in range(backbone.vocabulary_size) if i not in (backbone.start_token_id, backbone.pad_token_id)
    ]
    np.testing.assert_allclose(
        log_probabilities(theirs[..., generated]), log_probabilities(ours[..., generated]), atol=1e-4
    )


def test_own_vocabulary_keeps_its_ids_and_puts_pad_last(own_model, tmp_path):
    folder = export_transformers(own_model, tmp_path / "export")
    vocabulary = json.loads((folder / "vocab.json").read_text("utf-8"))
    pieces = own_model.preprocessor.tokenizer.get_vocabulary()
    assert vocabulary["<pad>"] == len(pieces) == len(vocabulary) - 1
    assert all(vocabulary[piece] == index for index, piece in enumerate(pieces) if piece != "<pad>")
    config = json.loads((folder / "config.json").read_text("utf-8"))
    assert config["pad_token_id"] == config["decoder_start_token_id"] == len(pieces)
    assert config["vocab_size"] == len(pieces) + 1
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text("utf-8"))
    assert tokenizer_config["sp_model_kwargs"] == {"add_bos": True}


def test_marian_epsilon_is_approximated_with_a_warning(tokenizer, tmp_path):
    model = make_model(tokenizer)  # the paper's 1e-6
    with pytest.warns(UserWarning, match="epsilon is 1e-06, Marian's is 1e-05"):
        export_transformers(model, tmp_path / "export")


@pytest.mark.parametrize(
    "overrides, fragment",
    [({"normalize_first": True}, "Pre-LN"), ({"activation": "tanh"}, "activation is 'tanh'")],
)
def test_what_marian_cannot_express_is_refused_before_writing(tokenizer, tmp_path, overrides, fragment):
    model = make_model(tokenizer, **overrides)
    with pytest.raises(MarianExportError, match=fragment):
        export_transformers(model, tmp_path / "export")
    assert list(tmp_path.iterdir()) == []


def test_quantized_model_is_refused(own_model, tmp_path):
    own_model.quantize("int8")
    with pytest.raises(MarianExportError, match="quantized"):
        export_transformers(own_model, tmp_path / "export")


def test_a_failed_export_leaves_the_previous_one(own_model, tmp_path, monkeypatch):
    target = tmp_path / "export"
    export_transformers(own_model, target)
    before = {path.name: path.read_bytes() for path in target.iterdir()}
    with pytest.raises(FileExistsError, match="overwrite"):
        export_transformers(own_model, target)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("safetensors.numpy.save_file", fail)
    with pytest.raises(OSError, match="disk full"):
        export_transformers(own_model, target, overwrite=True)
    assert {path.name: path.read_bytes() for path in target.iterdir()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["export"]


def test_command_line_exports_in_transformers_format(own_model, tmp_path, capsys):
    from keras_transformer.cli.main import main

    preset = tmp_path / "preset"
    own_model.save_to_preset(str(preset))
    assert main(["export", str(preset), str(tmp_path / "out"), "--format", "transformers"]) == 0
    assert (tmp_path / "out" / "model.safetensors").exists() and (tmp_path / "out" / "source.spm").exists()
    assert (
        main(["export", str(preset), str(tmp_path / "other"), "--format", "transformers", "--target-language", "deu"])
        == 1
    )
    assert "--target-language is for the SavedModel" in capsys.readouterr().err


# --- An Opus-MT model, fine-tuned here ---------------------------------------------


@pytest.fixture(scope="module")
def opus_mt_folder(tmp_path_factory):
    """An Opus-MT-style checkpoint (random weights, `</s>` = 0, `<pad>` last),
    every file written by `transformers`' `save_pretrained`."""
    from transformers import MarianTokenizer

    root = tmp_path_factory.mktemp("opus_mt")
    source_proto = train_sentencepiece(SOURCE_SENTENCES, 90)
    target_proto = train_sentencepiece(TARGET_SENTENCES, 90)
    vocabulary = make_vocabulary(source_proto, target_proto, VARIANTS["base"]["special_order"])
    (root / "source.spm").write_bytes(source_proto)
    (root / "target.spm").write_bytes(target_proto)
    (root / "vocab.json").write_text(json.dumps(vocabulary), "utf-8")
    folder = root / "checkpoint"
    MarianTokenizer(
        source_spm=str(root / "source.spm"),
        target_spm=str(root / "target.spm"),
        vocab=str(root / "vocab.json"),
        source_lang="en",
        target_lang="de",
    ).save_pretrained(str(folder))
    make_marian_model("base", vocabulary).save_pretrained(str(folder))
    return folder


@pytest.mark.slow
def test_fine_tuned_opus_mt_model_translates_the_same_after_export(opus_mt_folder, tmp_path):
    model = kt.Transformer.from_preset(str(opus_mt_folder))
    backbone = model.backbone
    embeddings = backbone.token_embedding.embeddings
    assert not ops.convert_to_numpy(embeddings)[backbone.start_token_id].any()
    model.compile(optimizer=keras.optimizers.Adam(0.01), label_smoothing=0.0)
    x, y, w = model.preprocessor({"encoder_text": SOURCE_SENTENCES, "decoder_text": TARGET_SENTENCES})
    model.fit(x, y, sample_weight=w, batch_size=len(SOURCE_SENTENCES), epochs=1, verbose=0)
    # Fine-tuning moved the decoder start's row (tied to the output projection):
    # the export has to make it zero again for CTranslate2.
    assert ops.convert_to_numpy(embeddings)[backbone.start_token_id].any()
    folder = export_transformers(model, tmp_path / "export")
    vocabulary = json.loads((folder / "vocab.json").read_text("utf-8"))
    assert vocabulary == json.loads((opus_mt_folder / "vocab.json").read_text("utf-8"))
    assert_same_translations(model, folder, tmp_path)


# --- A shipped preset ------------------------------------------------------------


@pytest.mark.slow
def test_shipped_preset_translates_the_same_after_export(tmp_path):
    model = kt.Transformer.from_preset("multi30k_en_de")
    with pytest.warns(UserWarning, match="epsilon"):
        folder = export_transformers(model, tmp_path / "export")
    texts = [
        "Two dogs play in the snow.",
        "A man in a blue shirt is riding a bicycle down the street.",
        "A little girl is eating an ice cream.",
    ]
    assert_same_translations(model, folder, tmp_path, texts, length=40, ended=3)


# --- Separate source and target vocabularies -----------------------------------------


@pytest.mark.slow
def test_separate_vocabularies_export_as_two_vocabularies(tmp_path):
    from marian_fixtures import write_multilingual_repo

    original = write_multilingual_repo(tmp_path / "multilingual")["folder"]
    model = kt.Transformer.from_preset(str(original))
    assert model.backbone.target_token_embedding is not None
    folder = export_transformers(model, tmp_path / "export")
    for name in ("vocab.json", "target_vocab.json"):
        assert json.loads((folder / name).read_text("utf-8")) == json.loads((original / name).read_text("utf-8"))
    config = json.loads((folder / "config.json").read_text("utf-8"))
    assert config["share_encoder_decoder_embeddings"] is False
    texts = [">>deu<< A dog runs across the green field.", ">>nld<< Two children are playing in the snow."]
    ids, mask = exported_tokens(folder, texts)
    end = model.backbone.end_token_id
    assert transformers_greedy(folder, ids, mask, end) == our_greedy(model, ids, mask)
