"""Marian (Opus-MT) checkpoints load exactly: logits, tokens, greedy and beam outputs.

Every checkpoint here is built on the spot by `marian_fixtures` (random
weights, SentencePiece models trained on a few sentences) and loaded offline
from a huggingface_hub cache through `Transformer.from_preset("hf://...")`,
the path a user takes. `transformers` and `torch` are the reference; they are
test-only dependencies.
"""

import json
import re
import shutil
import warnings

import keras
import numpy as np
import pytest
from keras import ops

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import keras_transformer as kt  # noqa: E402
from keras_transformer import marian  # noqa: E402
from keras_transformer.generation.decoding import search_step  # noqa: E402
from keras_transformer.presets.resolution import HubUnreachableError  # noqa: E402
from marian_fixtures import VARIANTS, hub_cache_repo, publish, write_marian_repo  # noqa: E402

TOLERANCE = 1e-4
SOURCES = [
    "A dog runs across the green field.",
    "Two children play.",
    "The woman reads a book in the garden, and a man rides a bicycle down the street.",
    "Cats sleep.",
]


@pytest.fixture(scope="session")
def marian_cache(tmp_path_factory):
    """A huggingface_hub cache holding every test checkpoint, by name."""
    root = tmp_path_factory.mktemp("marian")
    cache = root / "hub"
    checkpoints = {}
    for name, variant, weights, extra in (
        ("base", "base", "safetensors", {}),
        ("big", "big", "safetensors", {}),
        ("base-sharded", "base", "sharded", {}),
        ("base-h5", "base", "h5", {}),
        ("big-h5", "big", "h5", {}),
        ("base-bin", "base", "bin", {}),
        ("base-stale-lm-head", "base", "safetensors", {"extra_lm_head": True}),
    ):
        info = write_marian_repo(root / "folders" / name, variant, weights, **extra)
        repo = f"Helsinki-NLP/opus-mt-test-{name}"
        info["snapshot"] = publish(info["folder"], cache, repo)
        info["handle"] = f"hf://{repo}"
        checkpoints[name] = info
    return {"cache": cache, "root": root, "checkpoints": checkpoints}


@pytest.fixture(autouse=True)
def offline_cache(marian_cache, monkeypatch):
    """Every test runs offline on the test cache (huggingface_hub reads its
    settings at import, so its constants are patched too)."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_CACHE", str(marian_cache["cache"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(marian_cache["cache"]))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="session")
def loaded(marian_cache):
    """`Transformer.from_preset(hf://...)` of each checkpoint, loaded once."""
    from huggingface_hub import constants

    models = {}

    def load(name):
        if name not in models:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(constants, "HF_HUB_CACHE", str(marian_cache["cache"]))
                patch.setattr(constants, "HF_HUB_OFFLINE", True)
                models[name] = kt.Transformer.from_preset(marian_cache["checkpoints"][name]["handle"])
        return models[name]

    return load


def hf_tokenizer(info):
    from transformers import MarianTokenizer

    return MarianTokenizer.from_pretrained(str(info["folder"]))


def reference_logits(info, encoder_ids, encoder_mask, decoder_ids):
    with torch.no_grad():
        return info["model"](
            input_ids=torch.tensor(encoder_ids),
            attention_mask=torch.tensor(encoder_mask),
            decoder_input_ids=torch.tensor(decoder_ids),
        ).logits.numpy()


def our_logits(model, encoder_ids, encoder_mask, decoder_ids):
    return ops.convert_to_numpy(
        model(
            {
                "encoder_token_ids": encoder_ids,
                "encoder_padding_mask": encoder_mask,
                "decoder_token_ids": decoder_ids,
                "decoder_padding_mask": np.ones_like(decoder_ids),
            }
        )
    )


def source_batch(info, texts=SOURCES):
    encoded = hf_tokenizer(info)(texts, padding=True, return_tensors="np")
    return encoded["input_ids"].astype("int32"), encoded["attention_mask"].astype("int32")


def random_targets(info, batch, length, seed=0):
    vocabulary = info["vocabulary"]
    pad = vocabulary["<pad>"]
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, pad, size=(batch, length)).astype("int32")
    ids[:, 0] = pad  # the decoder start
    return ids


# --- Logits -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["base", "big"])
def test_logits_equal_marian_mt_model(name, marian_cache, loaded):
    info = marian_cache["checkpoints"][name]
    encoder_ids, encoder_mask = source_batch(info)
    decoder_ids = random_targets(info, len(SOURCES), 9)
    expected = reference_logits(info, encoder_ids, encoder_mask, decoder_ids)
    actual = our_logits(loaded(name), encoder_ids, encoder_mask, decoder_ids)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, atol=TOLERANCE, rtol=0)
    # A wrong sinusoid layout or a missing bias would be far off, not 1e-4.
    assert np.abs(expected).max() > 1.0


def test_variants_mirror_the_real_configs(marian_cache, loaded):
    base, big = loaded("base").backbone, loaded("big").backbone
    assert base.activation == "silu" and big.activation == "relu"
    for backbone in (base, big):
        assert backbone.position_encoding_layout == "concatenated"
        assert backbone.use_logits_bias and backbone.layer_norm_epsilon == 1e-5
    base_tokens, big_tokens = loaded("base").preprocessor.tokenizer, loaded("big").preprocessor.tokenizer
    assert (base_tokens.end_token_id, base_tokens.token_to_id("<unk>")) == (0, 1)
    assert big_tokens.end_token_id not in (0, 1)
    size = big.vocabulary_size
    assert big_tokens.pad_token_id == big_tokens.start_token_id == size - 1
    for backbone, tokenizer in ((base, base_tokens), (big, big_tokens)):
        # Decoding reads the special ids from the backbone's config.
        assert (backbone.end_token_id, backbone.pad_token_id, backbone.start_token_id, backbone.unk_token_id) == (
            tokenizer.end_token_id,
            tokenizer.pad_token_id,
            tokenizer.start_token_id,
            tokenizer.unk_token_id,
        )
    assert VARIANTS["big"]["decoder_layers"] == big.num_decoder_layers != big.num_encoder_layers


@pytest.mark.parametrize("name, reference", [("base-sharded", "base"), ("base-h5", "base"), ("big-h5", "big")])
def test_other_weight_files_load_the_same_weights(name, reference, marian_cache, loaded):
    info, reference_info = marian_cache["checkpoints"][name], marian_cache["checkpoints"][reference]
    assert not (info["snapshot"] / "model.safetensors").exists()
    encoder_ids, encoder_mask = source_batch(info)
    decoder_ids = random_targets(info, len(SOURCES), 7, seed=1)
    # tf_model.h5 cannot be read by transformers 5: the model that wrote it is the reference.
    expected = reference_logits(info, encoder_ids, encoder_mask, decoder_ids)
    np.testing.assert_allclose(
        our_logits(loaded(name), encoder_ids, encoder_mask, decoder_ids), expected, atol=TOLERANCE, rtol=0
    )
    np.testing.assert_allclose(
        expected, reference_logits(reference_info, encoder_ids, encoder_mask, decoder_ids), atol=1e-6
    )


def test_pickle_only_checkpoint_is_refused_unopened(marian_cache):
    info = marian_cache["checkpoints"]["base-bin"]
    with pytest.raises(marian.PickleOnlyError) as error:
        kt.Transformer.from_preset(info["handle"])
    message = str(error.value)
    assert "pytorch_model.bin" in message and "safe_serialization=True" in message
    assert "revision" in message and info["handle"] in message
    assert not info["marker"].exists(), "the pickle was unpickled"


def test_stale_lm_head_is_ignored_with_a_warning(marian_cache):
    info = marian_cache["checkpoints"]["base-stale-lm-head"]
    with pytest.warns(UserWarning, match="lm_head.weight differs from the shared embedding"):
        model = kt.Transformer.from_preset(info["handle"])
    encoder_ids, encoder_mask = source_batch(info)
    decoder_ids = random_targets(info, len(SOURCES), 5)
    np.testing.assert_allclose(
        our_logits(model, encoder_ids, encoder_mask, decoder_ids),
        reference_logits(info, encoder_ids, encoder_mask, decoder_ids),
        atol=TOLERANCE,
        rtol=0,
    )


def _saved_without_logits_bias(info, folder, **config_changes):
    """The checkpoint as `transformers` saves it from a state dict without
    `final_logits_bias`, its config changed by `config_changes`."""
    import copy

    from transformers import MarianTokenizer

    model = copy.deepcopy(info["model"])
    for field, value in config_changes.items():
        setattr(model.config, field, value)
    state = {name: value for name, value in model.state_dict().items() if name != "final_logits_bias"}
    model.save_pretrained(folder, state_dict=state)
    MarianTokenizer.from_pretrained(str(info["folder"])).save_pretrained(folder)
    return str(folder)


def test_missing_logits_bias_loads_as_zeros_with_a_warning(marian_cache, tmp_path):
    from transformers import MarianMTModel

    info = marian_cache["checkpoints"]["base"]
    folder = _saved_without_logits_bias(info, tmp_path / "no-bias")
    with pytest.warns(UserWarning, match=re.escape(folder) + ": the weights have no final_logits_bias.*all zeros"):
        model = kt.Transformer.from_preset(folder)
    assert not np.any(ops.convert_to_numpy(model.backbone.logits_bias.bias))
    theirs = {**info, "model": MarianMTModel.from_pretrained(folder).eval()}  # transformers: zeros too
    encoder_ids, encoder_mask = source_batch(info)
    decoder_ids = random_targets(info, len(SOURCES), 5)
    np.testing.assert_allclose(
        our_logits(model, encoder_ids, encoder_mask, decoder_ids),
        reference_logits(theirs, encoder_ids, encoder_mask, decoder_ids),
        atol=TOLERANCE,
        rtol=0,
    )


def test_missing_logits_bias_that_the_config_declares_is_refused(marian_cache, tmp_path):
    from keras_transformer.marian.convert import WeightMismatchError

    info = marian_cache["checkpoints"]["base"]
    folder = _saved_without_logits_bias(info, tmp_path / "declared", add_bias_logits=True)
    with pytest.raises(WeightMismatchError, match="add_bias_logits = True, but the weights have no final_logits_bias"):
        kt.Transformer.from_preset(folder)


# --- Refusals ---------------------------------------------------------------


def _config_only_repo(marian_cache, name, changes):
    """A cached repo with the base checkpoint's config (changed) and
    tokenizer files but no weights: a refusal must come before the weights."""
    info = marian_cache["checkpoints"]["base"]
    repo = f"Helsinki-NLP/opus-mt-test-{name}"
    snapshot = hub_cache_repo(marian_cache["cache"], repo)
    config = json.loads((info["folder"] / "config.json").read_text())
    config.update(changes)
    (snapshot / "config.json").write_text(json.dumps(config))
    for file in ("vocab.json", "source.spm", "target.spm"):
        shutil.copy(info["folder"] / file, snapshot / file)
    return f"hf://{repo}"


@pytest.mark.parametrize(
    "field, value",
    [
        ("normalize_before", True),
        ("static_position_embeddings", False),
        ("normalize_embedding", True),
        ("scale_embedding", False),
        ("decoder_vocab_size", 7),
        ("activation_function", "tanh"),
        ("decoder_ffn_dim", 96),
    ],
)
def test_unrepresentable_config_is_refused_before_weights(field, value, marian_cache):
    handle = _config_only_repo(marian_cache, f"bad-{field}", {field: value})
    with pytest.raises(marian.MarianConfigError) as error:
        kt.Transformer.from_preset(handle)
    message = str(error.value)
    assert handle in message and field in message and repr(value) in message
    assert message.count(". ") == 0, "one sentence"


def test_missing_weights_offline_say_so(marian_cache):
    handle = _config_only_repo(marian_cache, "no-weights", {})
    with pytest.raises(HubUnreachableError, match="not in the local cache"):
        kt.Transformer.from_preset(handle)


def test_vocabulary_that_does_not_fit_is_refused(marian_cache):
    handle = _config_only_repo(marian_cache, "vocab-mismatch", {"vocab_size": 200, "decoder_vocab_size": 200})
    with pytest.raises(marian.MarianConfigError, match="vocab.json has .* pieces but config.json has vocab_size = 200"):
        kt.Transformer.from_preset(handle)


def test_weights_that_do_not_fit_the_config_are_refused(marian_cache, tmp_path):
    info = marian_cache["checkpoints"]["base"]
    folder = tmp_path / "checkpoint"
    shutil.copytree(info["folder"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["encoder_layers"] = 1
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="model.encoder.layers.1.* only 1 encoder layers"):
        kt.Transformer.from_preset(str(folder))


# --- Tokenizer ----------------------------------------------------------------


def tokenizer_sentences():
    """A few hundred sentences: accents, CJK, emoji, punctuation, empty ones."""
    from marian_fixtures import SOURCE_SENTENCES, TARGET_SENTENCES

    extra = [
        "",
        " ",
        "  two  spaces  ",
        "Über café naïve façade déjà-vu.",
        "Straße, Größe, Äpfel!",
        "日本語の文です。",
        "中文句子，还有标点。",
        "한국어 문장",
        "Emoji 😀🎉 and 👍🏽 too",
        "tabs\tand\nnewlines",
        "Numbers 1,234.56 and 2026-11-30",
        "«quotes» “curly” 'single'",
        ">>fra<< A tagged sentence.",
        "ALL CAPS SENTENCE",
        "ǅ ﬁ ligatures and ① circled",
    ]
    words = " ".join(SOURCE_SENTENCES + TARGET_SENTENCES + extra).split(" ")
    rng = np.random.default_rng(0)
    mixed = [" ".join(rng.choice(words, size=rng.integers(1, 12))) for _ in range(250)]
    return SOURCE_SENTENCES + TARGET_SENTENCES + extra + mixed


@pytest.mark.parametrize("name", ["base", "big"])
def test_token_ids_equal_marian_tokenizer(name, marian_cache, loaded):
    info = marian_cache["checkpoints"][name]
    reference = hf_tokenizer(info)
    tokenizer = loaded(name).preprocessor.tokenizer
    sentences = tokenizer_sentences()
    assert len(sentences) >= 250
    end = tokenizer.end_token_id
    sources = [list(map(int, ids)) + [end] for ids in tokenizer(sentences)]
    assert sources == reference(sentences).input_ids
    targets = [list(map(int, ids)) + [end] for ids in tokenizer.tokenize_target(sentences)]
    assert targets == reference(text_target=sentences).input_ids
    # Not vacuous: unknown characters and both special tokens occur.
    flat = [i for ids in sources for i in ids]
    assert tokenizer.unk_token_id in flat and sources[sentences.index("")] == [end]


def test_detokenize_equals_marian_tokenizer_decode(marian_cache, loaded):
    info = marian_cache["checkpoints"]["big"]
    reference = hf_tokenizer(info)
    tokenizer = loaded("big").preprocessor.tokenizer
    sentences = [s for s in tokenizer_sentences() if s.strip()][:120]
    ids = reference(text_target=sentences).input_ids
    expected = [reference.decode(row, skip_special_tokens=True) for row in ids]
    actual = [t.decode("utf-8") if isinstance(t, bytes) else t for t in tokenizer.detokenize(ids)]
    assert actual == expected


def test_tokenizer_runs_inside_a_tf_graph(loaded):
    import tensorflow as tf

    tokenizer = loaded("base").preprocessor.tokenizer

    @tf.function
    def round_trip(text):
        return tokenizer.detokenize(tokenizer.tokenize_target(text))

    out = round_trip(tf.constant(["Zwei Kinder spielen im Schnee.", ""]))
    assert [t.decode() for t in out.numpy()] == ["Zwei Kinder spielen im Schnee.", ""]


def test_preprocessor_packs_like_marian(loaded, marian_cache):
    model = loaded("big")
    tokenizer = model.preprocessor.tokenizer
    x, y, w = model.preprocessor(
        {"encoder_text": ["A dog runs."], "decoder_text": ["Ein Hund rennt."]}, sequence_length=12
    )
    source = list(map(int, tokenizer("A dog runs.")))
    target = list(map(int, tokenizer.tokenize_target("Ein Hund rennt.")))
    pad, end = tokenizer.pad_token_id, tokenizer.end_token_id
    encoder_ids = ops.convert_to_numpy(x["encoder_token_ids"])[0].tolist()
    assert encoder_ids[: len(source) + 1] == source + [end]
    assert ops.convert_to_numpy(x["encoder_padding_mask"])[0].sum() == len(source) + 1
    decoder_ids = ops.convert_to_numpy(x["decoder_token_ids"])[0].tolist()
    assert decoder_ids[: len(target) + 1] == [pad] + target
    # The start token is the padding id, yet it is not masked as padding.
    assert ops.convert_to_numpy(x["decoder_padding_mask"])[0][: len(target) + 1].all()
    assert ops.convert_to_numpy(y)[0].tolist()[: len(target) + 1] == target + [end]
    assert ops.convert_to_numpy(w)[0].sum() == len(target) + 1


# --- Decoding -----------------------------------------------------------------


def hf_generate(info, encoder_ids, encoder_mask, **options):
    pad = info["vocabulary"]["<pad>"]
    with torch.no_grad():
        return (
            info["model"]
            .generate(
                input_ids=torch.tensor(encoder_ids),
                attention_mask=torch.tensor(encoder_mask),
                do_sample=False,
                bad_words_ids=[[pad]],
                forced_eos_token_id=None,  # ours forces </s> one token later
                **options,
            )
            .numpy()
        )


def our_tokens(model, encoder_ids, encoder_mask, max_extra_length, **options):
    """`search_step` (the backbone holds the special ids): token ids, not text."""
    buffer = np.zeros((len(encoder_ids), encoder_ids.shape[1] + max_extra_length), "int32")
    inputs = {"encoder_token_ids": encoder_ids, "encoder_padding_mask": encoder_mask, "decoder_token_ids": buffer}
    outputs = search_step(
        model.backbone,
        {k: ops.convert_to_tensor(v) for k, v in inputs.items()},
        max_extra_length=max_extra_length,
        **options,
    )
    return ops.convert_to_numpy(outputs["decoder_token_ids"])


def until_end(row, end):
    row = list(map(int, row))
    return row[: row.index(end) + 1] if end in row else row


@pytest.mark.parametrize("name", ["base", "big"])
def test_greedy_equals_transformers_generate(name, marian_cache, loaded):
    info, model = marian_cache["checkpoints"][name], loaded(name)
    encoder_ids, encoder_mask = source_batch(info)
    end = model.preprocessor.tokenizer.end_token_id
    extra = 20
    ours = our_tokens(model, encoder_ids, encoder_mask, extra, beam_size=None)
    # At most source length + `extra` tokens before </s>, as ours; compare up to
    # the first </s> (ours forces </s> at the limit, transformers does not).
    limit = int(encoder_mask.sum(axis=1).min()) - 1 + extra
    theirs = hf_generate(info, encoder_ids, encoder_mask, num_beams=1, max_new_tokens=limit)
    ended = 0
    for our_row, their_row in zip(ours, theirs):
        their_row = until_end(their_row, end)
        assert until_end(our_row, end)[: len(their_row)] == their_row
        ended += their_row[-1] == end
    assert ended >= 1, "no sentence ended: the comparison would not test </s>"


@pytest.mark.parametrize("name", ["base", "big"])
def test_beam_search_alpha_0_finds_transformers_best_hypothesis(name, marian_cache, loaded):
    info, model = marian_cache["checkpoints"][name], loaded(name)
    encoder_ids, encoder_mask = source_batch(info)
    end = model.preprocessor.tokenizer.end_token_id
    ours = our_tokens(model, encoder_ids, encoder_mask, 30, beam_size=4, alpha=0.0)
    # transformers' length_penalty=0 ranks by log P(Y), as alpha = 0 does.
    theirs = hf_generate(
        info,
        encoder_ids,
        encoder_mask,
        num_beams=4,
        length_penalty=0.0,
        max_new_tokens=30,
        early_stopping=False,
    )
    compared = 0
    for our_row, their_row in zip(ours, theirs):
        their_row = until_end(their_row, end)
        if their_row[-1] == end:
            assert until_end(our_row, end) == their_row
            compared += 1
    assert compared >= 2, "too few finished hypotheses to compare"


@pytest.mark.parametrize("beam_size", [None, 3])
def test_pad_is_never_generated(beam_size, marian_cache):
    info = marian_cache["checkpoints"]["base"]
    model = kt.Transformer.from_preset(info["handle"])
    tokenizer = model.preprocessor.tokenizer
    bias = ops.convert_to_numpy(model.backbone.logits_bias.bias).copy()
    bias[tokenizer.pad_token_id] = 100.0  # <pad> would win every step
    model.backbone.logits_bias.bias.assign(bias)
    encoder_ids, encoder_mask = source_batch(info)
    tokens = our_tokens(model, encoder_ids, encoder_mask, 5, beam_size=beam_size)
    for row in tokens:
        generated = until_end(row, tokenizer.end_token_id)[1:]
        assert generated and tokenizer.pad_token_id not in generated


@pytest.mark.parametrize("name", ["base", "big"])
def test_translate_equals_transformers_greedy_text(name, marian_cache, loaded):
    info, model = marian_cache["checkpoints"][name], loaded(name)
    texts = ["A dog runs.", "", "Two children play in the snow."]
    outputs = model.translate(texts, beam_size=None, max_extra_length=40)
    assert len(outputs) == 3 and outputs[1] == ""
    reference = hf_tokenizer(info)
    encoder_ids, encoder_mask = source_batch(info, [texts[0], texts[2]])
    theirs = hf_generate(info, encoder_ids, encoder_mask, num_beams=1, max_new_tokens=40)
    end = model.preprocessor.tokenizer.end_token_id
    for ours, their_row in zip([outputs[0], outputs[2]], theirs):
        if until_end(their_row, end)[-1] == end:
            assert ours == reference.decode(their_row, skip_special_tokens=True)


# --- Entry points -------------------------------------------------------------


def test_local_folder_and_revision_load(marian_cache, tmp_path):
    info = marian_cache["checkpoints"]["base"]
    encoder_ids, encoder_mask = source_batch(info)
    decoder_ids = random_targets(info, len(SOURCES), 4)
    expected = reference_logits(info, encoder_ids, encoder_mask, decoder_ids)
    folder_model = kt.Transformer.from_preset(str(info["folder"]))
    np.testing.assert_allclose(
        our_logits(folder_model, encoder_ids, encoder_mask, decoder_ids), expected, atol=TOLERANCE
    )
    revision_model = kt.Transformer.from_preset(info["handle"], revision=info["snapshot"].name)
    np.testing.assert_allclose(
        our_logits(revision_model, encoder_ids, encoder_mask, decoder_ids), expected, atol=TOLERANCE
    )
    with pytest.raises(HubUnreachableError):
        kt.Transformer.from_preset(info["handle"], revision="f" * 40)


def test_load_weights_false_builds_the_architecture(marian_cache):
    info = marian_cache["checkpoints"]["big"]
    model = kt.Transformer.from_preset(info["handle"], load_weights=False)
    assert model.backbone.activation == "relu"
    embedding = ops.convert_to_numpy(model.backbone.token_embedding.embeddings)
    assert not np.allclose(embedding, info["model"].model.shared.weight.detach().numpy())


def test_converted_model_saves_as_a_native_preset(marian_cache, loaded, tmp_path):
    model = loaded("big")
    model.save_to_preset(tmp_path / "preset")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = kt.Transformer.from_preset(str(tmp_path / "preset"))
    assert isinstance(again.preprocessor, marian.MarianPreprocessor)
    info = marian_cache["checkpoints"]["big"]
    encoder_ids, encoder_mask = source_batch(info)
    decoder_ids = random_targets(info, len(SOURCES), 6)
    np.testing.assert_allclose(
        our_logits(again, encoder_ids, encoder_mask, decoder_ids),
        reference_logits(info, encoder_ids, encoder_mask, decoder_ids),
        atol=TOLERANCE,
    )
    assert again.preprocessor.tokenizer(["Ein Hund."]) == model.preprocessor.tokenizer(["Ein Hund."])
    assert keras.saving.get_registered_object("keras_transformer>MarianTokenizer") is marian.MarianTokenizer


def test_convert_command_writes_a_checksummed_float16_preset(marian_cache, tmp_path):
    from keras_transformer.cli import main as cli
    from keras_transformer.presets.integrity import verify_preset

    info = marian_cache["checkpoints"]["base"]
    out = tmp_path / "opus_mt_tiny"
    assert cli.main(["convert", info["handle"], str(out), "--dtype", "float16"]) == 0
    verify_preset(out, require_checksums=True)
    card = (out / "README.md").read_text()
    assert info["handle"] in card and "license: cc-by-4.0" in card and "float16" in card
    model = kt.Transformer.from_preset(str(out))
    assert isinstance(model.preprocessor.tokenizer, marian.MarianTokenizer)
    encoder_ids, encoder_mask = source_batch(info)
    decoder_ids = random_targets(info, len(SOURCES), 5)
    np.testing.assert_allclose(
        our_logits(model, encoder_ids, encoder_mask, decoder_ids),
        reference_logits(info, encoder_ids, encoder_mask, decoder_ids),
        atol=0.05,  # float16 weights
    )


def test_convert_refuses_a_native_preset(tmp_path, capsys):
    from keras_transformer.cli import main as cli

    assert cli.main(["convert", "multi30k_en_de", str(tmp_path / "out")]) == 1
    assert "not a checkpoint in transformers format" in capsys.readouterr().err


def test_generated_start_token_is_not_masked_as_padding(marian_cache, loaded):
    """Marian's decoder start is the padding id; the output mask still counts it."""
    info, model = marian_cache["checkpoints"]["base"], loaded("base")
    encoder_ids, encoder_mask = source_batch(info)
    buffer = np.zeros((len(encoder_ids), encoder_ids.shape[1] + 5), "int32")
    inputs = {"encoder_token_ids": encoder_ids, "encoder_padding_mask": encoder_mask, "decoder_token_ids": buffer}
    outputs = search_step(model.backbone, {k: ops.convert_to_tensor(v) for k, v in inputs.items()}, beam_size=None)
    tokens = ops.convert_to_numpy(outputs["decoder_token_ids"])
    mask = ops.convert_to_numpy(outputs["decoder_padding_mask"])
    pad = model.backbone.pad_token_id
    assert (tokens[:, 0] == pad).all() and mask[:, 0].all()
    assert not mask[:, 1:][tokens[:, 1:] == pad].any()
