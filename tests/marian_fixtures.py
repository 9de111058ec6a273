"""Small Marian (Opus-MT) checkpoints built on the spot, in the Hub's layout.

Each checkpoint is a briefly trained `transformers.MarianMTModel` with
SentencePiece models trained here and a `vocab.json` made as Marian's
converter makes it: the pieces of both SentencePiece models in one map,
`</s>`, `<unk>` and a trailing `<pad>` (id V - 1, also the decoder start).
`transformers` writes its files (`save_pretrained` of the `MarianTokenizer`
and of the model, whose `config.json` keeps the legacy fields real Opus-MT
configs carry). `publish` copies it into a folder laid out as
huggingface_hub's cache (`models--org--name/snapshots/<revision>/...` plus
`refs/main`), so that `hf://org/name` loads it offline through the same
code path a user takes.

Two variants, as on the Hub:

- `"base"` (Helsinki-NLP/opus-mt-en-de): swish, `</s>` = 0, `<unk>` = 1;
- `"big"` (Helsinki-NLP/opus-mt-tc-big-en-fr): ReLU, `</s>` in the middle of
  the vocabulary (43311 of 53017 there), `<unk>` not 1.

and four ways of storing the weights: `"safetensors"`, `"sharded"`
(`model.safetensors.index.json`), `"h5"` (only `tf_model.h5`, in the layout
`transformers`' TensorFlow classes saved) and `"bin"` (only
`pytorch_model.bin`, a pickle that must never be opened). `transformers` 5
writes safetensors only: the last two are made from its `model.safetensors`.

`transformers` and `torch` are test-only dependencies: this module is the
only place, with the tests, that imports them.
"""

import functools
import io
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

SOURCE_SENTENCES = [
    "A dog runs across the green field.",
    "Two children are playing in the snow.",
    "The woman reads a book in the garden.",
    "A man is riding a bicycle down the street.",
    "Some people are waiting for the bus.",
    "The cat sleeps on the warm window sill.",
    "A little girl eats an ice cream.",
    "Three friends are laughing at a joke.",
]
TARGET_SENTENCES = [
    "Ein Hund rennt über die grüne Wiese.",
    "Zwei Kinder spielen im Schnee.",
    "Die Frau liest ein Buch im Garten.",
    "Ein Mann fährt mit dem Fahrrad die Straße entlang.",
    "Einige Leute warten auf den Bus.",
    "Die Katze schläft auf der warmen Fensterbank.",
    "Ein kleines Mädchen isst ein Eis.",
    "Drei Freunde lachen über einen Witz.",
]
DUTCH_SENTENCES = [
    "Een hond rent over het groene veld.",
    "Twee kinderen spelen in de sneeuw.",
    "De vrouw leest een boek in de tuin.",
    "Een man fietst door de straat.",
    "Sommige mensen wachten op de bus.",
    "De kat slaapt op de warme vensterbank.",
    "Een klein meisje eet een ijsje.",
    "Drie vrienden lachen om een grap.",
]
# The multilingual checkpoint's target languages and their sentences; its
# vocabulary also has a language it was never trained into (">>eng<<").
LANGUAGE_SENTENCES = {"deu": TARGET_SENTENCES, "nld": DUTCH_SENTENCES}
LANGUAGE_TAGS = [">>deu<<", ">>eng<<", ">>nld<<"]
REVISION = "0123456789abcdef0123456789abcdef01234567"
# The fields `transformers` no longer reads but every Opus-MT config.json
# still carries: the converter must check them (e.g. normalize_before).
# MarianConfig keeps them and `save_pretrained` writes them. (The real files'
# generation fields, such as num_beams, `transformers` 5 no longer writes.)
LEGACY_FIELDS = {
    "add_bias_logits": False,
    "add_final_layer_norm": False,
    "normalize_before": False,
    "normalize_embedding": False,
    "static_position_embeddings": True,
    "classif_dropout": 0.0,
}
VARIANTS = {
    "base": dict(
        repo="Helsinki-NLP/opus-mt-tiny-en-de",
        activation_function="swish",
        d_model=32,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_layers=2,
        decoder_layers=2,
        max_position_embeddings=128,
        special_order=("</s>", "<unk>"),  # ids 0 and 1, pieces after them
    ),
    "big": dict(
        repo="Helsinki-NLP/opus-mt-tc-tiny-en-fr",
        activation_function="relu",
        d_model=32,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_layers=2,
        decoder_layers=3,
        max_position_embeddings=256,
        special_order=None,  # </s> and <unk> among the pieces
    ),
}


def train_sentencepiece(sentences: list[str], vocabulary_size: int) -> bytes:
    """A SentencePiece unigram model with SentencePiece's own defaults, as Marian's."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences * 20),
        model_writer=model,
        vocab_size=vocabulary_size,
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return model.getvalue()


def pieces_of(proto: bytes) -> list[str]:
    """The pieces of a SentencePiece model, in id order, control pieces left out."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    return [
        processor.id_to_piece(i)
        for i in range(processor.get_piece_size())
        if not (processor.is_control(i) or processor.is_unknown(i))
    ]


def make_vocabulary(source_proto: bytes, target_proto: bytes, special_order) -> dict[str, int]:
    """vocab.json as Marian's converter writes it: one map for both languages,
    `<pad>` last. `special_order=None` puts `</s>` and `<unk>` among the
    pieces, as in the tc-big models."""
    pieces = list(dict.fromkeys(pieces_of(source_proto) + pieces_of(target_proto)))
    if special_order is None:
        pieces.insert(len(pieces) * 2 // 3, "</s>")
        pieces.insert(5, "<unk>")
        ordered = pieces
    else:
        ordered = list(special_order) + pieces
    ordered.append("<pad>")
    return {piece: i for i, piece in enumerate(ordered)}


def make_marian_model(variant: str, vocabulary: dict[str, int], seed: int = 0):
    """A `MarianMTModel` with random weights large enough to give varied outputs."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    spec = VARIANTS[variant]
    size = len(vocabulary)
    pad, eos = vocabulary["<pad>"], vocabulary["</s>"]
    config = MarianConfig(
        vocab_size=size,
        decoder_vocab_size=size,
        d_model=spec["d_model"],
        encoder_layers=spec["encoder_layers"],
        decoder_layers=spec["decoder_layers"],
        encoder_attention_heads=spec["encoder_attention_heads"],
        decoder_attention_heads=spec["decoder_attention_heads"],
        encoder_ffn_dim=spec["encoder_ffn_dim"],
        decoder_ffn_dim=spec["decoder_ffn_dim"],
        activation_function=spec["activation_function"],
        max_position_embeddings=spec["max_position_embeddings"],
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=eos,
        forced_eos_token_id=eos,
        bos_token_id=0,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        init_std=0.2,  # 0.02 would make every logit nearly equal
        extra_pos_embeddings=size,  # as in the real files
        **LEGACY_FIELDS,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        # Marian trains the bias; a random one checks that it is added.
        model.final_logits_bias.normal_(0.0, 0.5)
        # Marian gives <pad> (the decoder start) a zero embedding.
        model.model.shared.weight[pad].zero_()
    return model


def save_marian_tokenizer(
    folder: Path,
    source_proto: bytes,
    target_proto: bytes,
    vocabulary: dict[str, int],
    target_vocabulary: dict[str, int] | None = None,
    source_lang: str = "en",
    target_lang: str = "de",
):
    """Writes `transformers`' `MarianTokenizer` of these SentencePiece models
    and vocabularies (`target_vocabulary`: separate ones) into `folder`, with
    `save_pretrained`, and returns it as read back from there."""
    from transformers import MarianTokenizer

    with tempfile.TemporaryDirectory() as inputs:
        # The tokenizer's inputs, as Marian's converter hands them over.
        inputs = Path(inputs)
        (inputs / "source.spm").write_bytes(source_proto)
        (inputs / "target.spm").write_bytes(target_proto)
        (inputs / "vocab.json").write_text(json.dumps(vocabulary), "utf-8")
        separate = target_vocabulary is not None
        if separate:
            (inputs / "target_vocab.json").write_text(json.dumps(target_vocabulary), "utf-8")
        MarianTokenizer(
            source_spm=str(inputs / "source.spm"),
            target_spm=str(inputs / "target.spm"),
            vocab=str(inputs / "vocab.json"),
            target_vocab_file=str(inputs / "target_vocab.json") if separate else None,
            separate_vocabs=separate,
            source_lang=source_lang,
            target_lang=target_lang,
        ).save_pretrained(str(folder))
    return MarianTokenizer.from_pretrained(str(folder))


def train_briefly(model, tokenizer, steps: int = 150, seed: int = 0) -> None:
    """Fits the model to the fixture's sentence pairs for a few Adam steps.

    Random weights decode to one token repeated without end; a little
    training gives outputs that differ per sentence and end with `</s>` at
    different lengths, which greedy and beam comparisons need. The random
    `final_logits_bias` (a buffer, not trained) stays as it was.
    """
    import torch

    batch = tokenizer(SOURCE_SENTENCES, text_target=TARGET_SENTENCES, padding=True, return_tensors="pt")
    labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss.backward()
        optimizer.step()
    model.eval()


def _tf_name(name: str) -> tuple[str, bool]:
    """A `transformers` PyTorch weight name as its TensorFlow class saved it,
    and whether the array is a Dense kernel (stored `[in, out]`)."""
    if name == "model.shared.weight":
        return "model.shared/model.shared/weight:0", False
    if name == "final_logits_bias":
        return "final_logits_bias:0", False
    path = name.removeprefix("model.").split(".")
    # encoder.layers.0.self_attn.q_proj.weight -> encoder/layers.0/self_attn/q_proj/kernel:0
    stack, _, index, *module, leaf = path
    norm = module[-1].endswith("layer_norm")
    leaf = {"weight": "gamma" if norm else "kernel", "bias": "beta" if norm else "bias"}[leaf]
    scope = "/".join([f"tf_marian_mt_model/model/{stack}", f"layers.{index}", *module])
    return f"{scope}/{leaf}:0", leaf == "kernel"


def write_tf_h5(state: dict[str, np.ndarray], path: Path) -> None:
    """Writes weights the way `TFMarianMTModel.save_pretrained` did (Keras 2
    `save_weights` HDF5): one group per top-level layer (`model`, and
    `final_logits_bias`), each listing its `weight_names`, Dense kernels
    transposed to `[in, out]`, and the position tables that TensorFlow
    stored too."""
    import h5py

    groups = {"model": {}, "final_logits_bias": {}}
    for name, value in state.items():
        tf_name, is_kernel = _tf_name(name)
        group = "final_logits_bias" if name == "final_logits_bias" else "model"
        groups[group][tf_name] = value.T if is_kernel else value
    size, dim = state["model.shared.weight"].shape
    for stack in ("encoder", "decoder"):
        table = np.zeros((128, dim), "float32")
        groups["model"][f"tf_marian_mt_model/model/{stack}/embed_positions/embeddings:0"] = table
    with h5py.File(path, "w") as file:
        file.attrs["layer_names"] = [name.encode() for name in groups]
        file.attrs["backend"] = b"tensorflow"
        file.attrs["keras_version"] = b"2.10.0"
        for group_name, weights in groups.items():
            group = file.create_group(group_name)
            group.attrs["weight_names"] = [name.encode() for name in weights]
            for name, value in weights.items():
                group.create_dataset(name, data=value)


class _Trap:
    """Unpickling this writes a file: proof that a pickle was opened."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "unpickled"))


def _write_model_card(folder: Path) -> None:
    """README.md as the Hub's cards start (the converter copies its license)."""
    (folder / "README.md").write_text(
        "---\nlanguage:\n- en\n- de\ntags:\n- translation\nlicense: cc-by-4.0\n---\n# A tiny test model\n", "utf-8"
    )


@functools.cache
def trained_checkpoint(variant: str, seed: int = 0):
    """`(source_proto, target_proto, vocabulary, model)`, built and trained
    once per variant and seed: every weights format stores the same model."""
    source_proto = train_sentencepiece(SOURCE_SENTENCES, 90)
    target_proto = train_sentencepiece(TARGET_SENTENCES, 90)
    vocabulary = make_vocabulary(source_proto, target_proto, VARIANTS[variant]["special_order"])
    model = make_marian_model(variant, vocabulary, seed)
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = save_marian_tokenizer(Path(folder), source_proto, target_proto, vocabulary)
    train_briefly(model, tokenizer, seed=seed)
    return source_proto, target_proto, vocabulary, model


def write_marian_repo(
    folder: Path,
    variant: str = "base",
    weights: str = "safetensors",
    seed: int = 0,
    extra_lm_head: bool = False,
) -> dict:
    """Writes a Marian checkpoint into `folder`, as `save_pretrained` writes it.

    Args:
        folder: created if needed.
        variant: `"base"` or `"big"`, see the module docstring.
        weights: `"safetensors"`, `"sharded"`, `"h5"` or `"bin"`.
        seed: for the random weights.
        extra_lm_head: store a separate `lm_head.weight` that differs from
            the embeddings, as some broken uploads did.

    Returns:
        `{"model": MarianMTModel, "vocabulary": dict, "folder": Path}`
        (for `"bin"`, also `"marker"`: the file unpickling would create).
    """
    import torch
    from safetensors.numpy import load_file, save_file

    if weights not in ("safetensors", "sharded", "h5", "bin"):
        raise ValueError(f"unknown weights format {weights!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    source_proto, target_proto, vocabulary, model = trained_checkpoint(variant, seed)
    save_marian_tokenizer(folder, source_proto, target_proto, vocabulary)
    _write_model_card(folder)
    # Shards of half the float32 weights' bytes: two or more of them.
    shards = {"max_shard_size": model.num_parameters() * 4 // 2} if weights == "sharded" else {}
    model.save_pretrained(str(folder), **shards)
    result = {"model": model, "vocabulary": vocabulary, "folder": folder}
    saved = folder / "model.safetensors"
    if extra_lm_head:
        # transformers ties lm_head.weight to the embeddings and never stores it.
        state = load_file(saved)
        state["lm_head.weight"] = state["model.shared.weight"] + 0.25
        save_file(state, saved, metadata={"format": "pt"})
    if weights == "h5":
        # transformers 5 has no TensorFlow classes to write tf_model.h5.
        write_tf_h5(load_file(saved), folder / "tf_model.h5")
        saved.unlink()
    elif weights == "bin":
        # transformers 5 writes no pickles, and none with a trap in it.
        marker = folder.parent / f"{folder.name}.unpickled"
        state = {name: torch.from_numpy(value) for name, value in load_file(saved).items()}
        torch.save({"trap": _Trap(marker), **state}, folder / "pytorch_model.bin")
        saved.unlink()
        result["marker"] = marker
    return result


def hub_cache_repo(cache: Path, repo: str, revision: str = REVISION) -> Path:
    """The snapshot folder of `repo` in a huggingface_hub cache at `cache`,
    created with `refs/main` pointing at `revision`."""
    root = Path(cache) / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(revision)
    return snapshot


def publish(folder: Path, cache: Path, repo: str) -> Path:
    """Copies a checkpoint folder into the cache as `repo`'s main revision."""
    snapshot = hub_cache_repo(cache, repo)
    for path in Path(folder).iterdir():
        shutil.copy2(path, snapshot / path.name)
    return snapshot


def write_multilingual_repo(folder: Path, seed: int = 0) -> dict:
    """A multilingual Marian checkpoint with separate vocabularies, written by
    `transformers` itself (`save_pretrained` of the tokenizer and the model).

    As the newer Opus-MT conversions: `share_encoder_decoder_embeddings:
    false`, so an encoder embedding over `vocab.json` and a decoder embedding
    over `target_vocab.json` (to which `lm_head` is tied); the source starts
    with a target-language token (`>>deu<<`, `>>nld<<`). The two vocabularies
    differ in size, and `</s>` and `<unk>` are ids 0 and 1 in both, as Marian
    numbers them. The model is trained briefly on English to German and
    Dutch, so that the language token changes the translation.

    Returns:
        `{"model": MarianMTModel, "tokenizer": MarianTokenizer, "folder": Path}`.
    """
    import torch
    from transformers import MarianConfig, MarianMTModel

    folder = Path(folder)
    targets = [s for sentences in LANGUAGE_SENTENCES.values() for s in sentences]
    # The source vocabulary is the larger: `<pad>` (the target's last id) is
    # the padding index of both embeddings, as in every converted checkpoint.
    source_proto = train_sentencepiece(SOURCE_SENTENCES, 120)
    target_proto = train_sentencepiece(targets, 50)
    source_pieces = ["</s>", "<unk>", *LANGUAGE_TAGS, *pieces_of(source_proto), "<pad>"]
    target_pieces = ["</s>", "<unk>", *pieces_of(target_proto), "<pad>"]
    tokenizer = save_marian_tokenizer(
        folder,
        source_proto,
        target_proto,
        {p: i for i, p in enumerate(source_pieces)},
        {p: i for i, p in enumerate(target_pieces)},
        source_lang="eng",
        target_lang="deu+nld",
    )
    pad = len(target_pieces) - 1
    config = MarianConfig(
        vocab_size=len(source_pieces),
        decoder_vocab_size=len(target_pieces),
        share_encoder_decoder_embeddings=False,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="relu",
        max_position_embeddings=128,
        scale_embedding=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        bos_token_id=0,
        dropout=0.1,
        attention_dropout=0.0,
        init_std=0.2,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5)
        model.model.decoder.embed_tokens.weight[pad].zero_()
    sources = [f">>{language}<< {s}" for language in LANGUAGE_SENTENCES for s in SOURCE_SENTENCES]
    batch = tokenizer(sources, padding=True, return_tensors="pt")
    labels = tokenizer(text_target=targets, padding=True, return_tensors="pt")
    batch["labels"] = labels["input_ids"].masked_fill(labels["attention_mask"] == 0, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(120):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(str(folder))
    return {"model": model, "tokenizer": tokenizer, "folder": folder}


# The Hindi of SOURCE_SENTENCES, in Devanagari: the source side of a hi-en checkpoint.
HINDI_SENTENCES = [
    "एक कुत्ता हरे मैदान में दौड़ता है।",
    "दो बच्चे बर्फ में खेल रहे हैं।",
    "महिला बगीचे में एक किताब पढ़ती है।",
    "एक आदमी सड़क पर साइकिल चला रहा है।",
    "कुछ लोग बस का इंतज़ार कर रहे हैं।",
    "बिल्ली गर्म खिड़की पर सोती है।",
    "एक छोटी लड़की आइसक्रीम खाती है।",
    "तीन दोस्त एक चुटकुले पर हंस रहे हैं।",
]


def write_untrained_repo(
    folder: Path, sources: list[str], targets: list[str], source_lang: str, target_lang: str, seed: int = 0
) -> dict:
    """An untrained Opus-MT-style checkpoint (the "base" variant) of the
    languages of `sources` and `targets`, its vocabularies made of them,
    written by `transformers`: random weights, for tests of where texts go
    (a Hindi one: `HINDI_SENTENCES` into English, as Helsinki-NLP/opus-mt-hi-en).

    Returns:
        `{"model": MarianMTModel, "folder": Path}`.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    source_proto = train_sentencepiece(sources, 90)
    target_proto = train_sentencepiece(targets, 90)
    vocabulary = make_vocabulary(source_proto, target_proto, VARIANTS["base"]["special_order"])
    model = make_marian_model("base", vocabulary, seed)
    save_marian_tokenizer(
        folder, source_proto, target_proto, vocabulary, source_lang=source_lang, target_lang=target_lang
    )
    _write_model_card(folder)
    model.save_pretrained(str(folder))
    return {"model": model, "folder": folder}
