"""What the model attends to, as numbers and as pictures (Figures 3 to 5).

`attention_maps` translates one sentence greedily, then runs the model again
on its own output (teacher forcing) one layer at a time and collects the
attention weights: the encoder's self-attention of every layer, and the
decoder's encoder-decoder attention of every layer. `plot_cross_attention`
draws the heads of one decoder layer in a grid, rows labelled with output
subwords and columns with source subwords; `plot_self_attention` draws one
head of one encoder layer, as the paper's Figure 4 does.

The weights are the blocks' own: each block is asked for them
(`return_attention_scores`, `return_cross_attention_scores`) along with its
output, both computed by the one attention function of training and
decoding (`keras_transformer.layers.attention`).

Example:
>>> import keras_transformer as kt
>>> from keras_transformer.generation.attention_maps import attention_maps
>>> pairs = [("a dog runs .", "ein hund rennt ."), ("a cat .", "eine katze .")]
>>> tokenizer = kt.train_tokenizer([s for p in pairs for s in p] * 10, 40)
>>> model = kt.Transformer(
...     backbone=kt.TransformerBackbone(
...         vocabulary_size=tokenizer.vocabulary_size(), num_encoder_layers=1,
...         num_decoder_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32),
...     preprocessor=kt.TransformerPreprocessor(tokenizer, 16, 16))
>>> maps = attention_maps(model, "a dog runs .")
>>> maps.cross_attention.shape[:2]  # (decoder layers, heads, outputs, sources)
(2, 2)
"""

import dataclasses
import math
import os
import textwrap

import numpy as np
from keras import ops

from keras_transformer.generation.decoding import compiled_search, resolve_jit_compile
from keras_transformer.generation.settings import SearchSettings

WORD_START = "\u2581"  # SentencePiece's mark of a piece that begins a word


@dataclasses.dataclass
class AttentionMaps:
    """Attention weights of one translated sentence.

    Attributes:
        source: the translated sentence.
        translation: its greedy translation.
        source_pieces: the encoder's subwords, `<s>` and `</s>` included.
        output_pieces: the subwords the decoder emitted, `</s>` included;
            row i of a cross-attention map is the query that emitted the
            i-th of them.
        encoder_self_attention: `(encoder layers, heads, sources, sources)`.
        cross_attention: `(decoder layers, heads, outputs, sources)`.
    """

    source: str
    translation: str
    source_pieces: list[str]
    output_pieces: list[str]
    encoder_self_attention: np.ndarray
    cross_attention: np.ndarray


def attention_maps(model, sentence: str) -> AttentionMaps:
    """Translates `sentence` greedily and returns the attention weights.

    Args:
        model: a `keras_transformer.Transformer` with a preprocessor.
        sentence: one sentence, at most `model.max_source_tokens` tokens.

    Raises:
        ValueError: no preprocessor, an empty sentence, or one too long.
    """
    if model.preprocessor is None:
        raise ValueError("attention_maps needs a model with a preprocessor (tokenizer).")
    tokenizer = model.preprocessor.tokenizer
    backbone = model.backbone
    token_ids = [int(i) for i in ops.convert_to_numpy(tokenizer(sentence))]
    if not token_ids:
        raise ValueError("The sentence has no tokens; give a sentence with words in it.")
    if len(token_ids) > model.max_source_tokens:
        raise ValueError(
            f"The sentence has {len(token_ids)} tokens, more than the {model.max_source_tokens} "
            "this model takes; pictures of attention need one sentence that fits."
        )
    # Packed without padding, so that every column of a picture is a subword.
    source = model.preprocessor.pack_sources([token_ids], bucket=1)
    output_ids = _greedy_output(model, source)
    # Teacher forcing: the decoder reads <s> y_1 ... y_n and emits y_1 ... y_n </s>.
    decoder_ids = np.array([output_ids[:-1]], "int32")

    source_ids, source_mask = source["encoder_token_ids"], source["encoder_padding_mask"]
    encoder_maps, encoder_output = _encoder_attention(backbone, source_ids, source_mask)
    cross_maps = _cross_attention(backbone, decoder_ids, encoder_output, source_mask)
    target_piece = _target_piece_lookup(tokenizer)
    return AttentionMaps(
        source=sentence,
        translation=_text(tokenizer.detokenize(np.array([output_ids[1:-1]], "int32"))),
        source_pieces=[_label(tokenizer.id_to_token(int(i))) for i in source_ids[0]],
        output_pieces=[_label(target_piece(i)) for i in output_ids[1:]],
        encoder_self_attention=encoder_maps,
        cross_attention=cross_maps,
    )


def _greedy_output(model, source: dict) -> list[int]:
    """The greedy translation's token ids, `<s>` and `</s>` included."""
    settings = SearchSettings(beam_size=None)
    search = compiled_search(model, resolve_jit_compile(), settings)
    buffer = np.zeros((1, source["encoder_token_ids"].shape[1] + settings.max_extra_length), "int32")
    outputs = search(
        {**{k: ops.convert_to_tensor(v) for k, v in source.items()}, "decoder_token_ids": ops.convert_to_tensor(buffer)}
    )
    ids, keep = (ops.convert_to_numpy(outputs[k])[0] for k in ("decoder_token_ids", "decoder_padding_mask"))
    return [int(i) for i in ids[keep.astype(bool)]]


def _text(strings) -> str:
    value = np.asarray(ops.convert_to_numpy(strings)).reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _encoder_attention(backbone, token_ids, padding_mask):
    """Each encoder layer's self-attention weights, and the encoder's output."""
    x = backbone.embed_source(token_ids)
    maps = []
    for block in backbone.encoder_blocks:
        x, scores = block(x, padding_mask=padding_mask, return_attention_scores=True)
        maps.append(ops.convert_to_numpy(scores)[0].astype("float32"))
    if backbone.encoder_final_norm is not None:
        x = backbone.encoder_final_norm(x)
    return np.stack(maps), x


def _cross_attention(backbone, decoder_ids, encoder_output, source_mask):
    """Each decoder layer's encoder-decoder attention weights."""
    x = backbone.embed_target(decoder_ids)
    maps = []
    for block in backbone.decoder_blocks:
        x, scores = block(x, encoder_output, encoder_padding_mask=source_mask, return_cross_attention_scores=True)
        maps.append(ops.convert_to_numpy(scores)[0].astype("float32"))
    return np.stack(maps)


def _target_piece_lookup(tokenizer):
    """The target-side piece of an id: `id_to_token` is the source's, and a
    checkpoint with separate vocabularies (Marian's `target_vocabulary`)
    numbers the decoder's pieces on their own."""
    vocabulary = tokenizer.target_vocabulary
    if vocabulary is None:
        return lambda token_id: tokenizer.id_to_token(int(token_id))
    pieces = {index: piece for piece, index in vocabulary.items()}
    return lambda token_id: pieces[int(token_id)]


def _label(piece: str) -> str:
    """A subword as a label: a word's first piece as itself, a piece that
    continues a word after "##", as BERT writes them (SentencePiece marks the
    word starts instead, with "▁")."""
    if piece.startswith(WORD_START):
        return piece[len(WORD_START) :] or WORD_START
    if piece.startswith("<") and piece.endswith(">"):
        return piece
    return "##" + piece


def _layer_index(layer: int, count: int, stack: str) -> int:
    if not -count <= layer < count:
        raise ValueError(
            f"--layer {layer} is out of range: the {stack} has {count} layers (0 to {count - 1}, or -1 for the last)."
        )
    return layer % count


def _check_heads(heads, count: int) -> list[int]:
    heads = list(range(count)) if heads is None else list(heads)
    wrong = [h for h in heads if not 0 <= h < count]
    if wrong or not heads:
        raise ValueError(f"heads {wrong or heads} are out of range: the model has {count} heads (0 to {count - 1}).")
    return heads


def plot_cross_attention(maps: AttentionMaps, path: str | os.PathLike, layer: int = -1, heads=None) -> None:
    """Draws the encoder-decoder attention of `heads` (default all) of one
    decoder layer in a grid, and saves it as an image (PNG, SVG, PDF...).

    Args:
        maps: from `attention_maps`.
        path: the image file; its suffix picks the format.
        layer: decoder layer, from 0; negative counts from the last.
        heads: head indices, or `None` for all.
    """
    layer = _layer_index(layer, maps.cross_attention.shape[0], "decoder")
    heads = _check_heads(heads, maps.cross_attention.shape[1])
    title = [
        f"Encoder-decoder attention of decoder layer {layer} "
        f"(layers 0\u2013{maps.cross_attention.shape[0] - 1}, greedy translation)",
        f"source: {maps.source}",
        f"output: {maps.translation}",
    ]
    _draw(
        [maps.cross_attention[layer, h] for h in heads],
        [f"head {h}" for h in heads],
        maps.source_pieces,
        maps.output_pieces,
        "source",
        "output",
        title,
        path,
    )


def plot_self_attention(maps: AttentionMaps, path: str | os.PathLike, layer: int = -1, head: int = 0) -> None:
    """Draws one head of one encoder layer's self-attention (as Figure 4
    does) and saves it as an image.

    Args:
        maps: from `attention_maps`.
        path: the image file; its suffix picks the format.
        layer: encoder layer, from 0; negative counts from the last.
        head: the head's index.
    """
    layer = _layer_index(layer, maps.encoder_self_attention.shape[0], "encoder")
    (head,) = _check_heads([head], maps.encoder_self_attention.shape[1])
    title = [
        f"Encoder self-attention of layer {layer} "
        f"(layers 0\u2013{maps.encoder_self_attention.shape[0] - 1}), head {head}",
        f"source: {maps.source}",
    ]
    _draw(
        [maps.encoder_self_attention[layer, head]],
        [None],
        maps.source_pieces,
        maps.source_pieces,
        "attended to (keys)",
        "attending (queries)",
        title,
        path,
    )


def _draw(matrices, subtitles, columns, rows, column_label, row_label, title, path) -> None:
    """Heat maps in a grid with one shared colour bar, saved to `path`;
    `title` is a list of lines, wrapped to the picture's width."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no window, no display needed
    import matplotlib.pyplot as plt

    count = len(matrices)
    # Near-square grids: 4 heads 2 x 2, 8 heads 4 x 2, 16 heads 4 x 4.
    grid_columns = count if count <= 3 else 2 if count == 4 else 3 if count in (5, 6, 9) else 4
    grid_rows = math.ceil(count / grid_columns)
    # Cells big enough for 9-point labels; a long sentence makes a big picture.
    cell = 0.28
    width = max(3.0, cell * len(columns) + 1.4)
    height = max(2.5, cell * len(rows) + 1.2)
    figure_width = width * grid_columns + 1.2
    # About 0.6 em per character of an 11-point font, 72 points an inch.
    title = "\n".join(textwrap.fill(line, max(30, int(figure_width * 72 / (11 * 0.6)))) for line in title)
    figure, axes = plt.subplots(
        grid_rows,
        grid_columns,
        figsize=(figure_width, height * grid_rows + 0.4 + 0.2 * title.count("\n")),
        squeeze=False,
        layout="constrained",
    )
    image = None
    for index, axis in enumerate(axes.flat):
        if index >= count:
            axis.axis("off")
            continue
        image = axis.imshow(matrices[index], cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal")
        axis.set_xticks(range(len(columns)), columns, rotation=90, fontsize=9)
        axis.set_yticks(range(len(rows)), rows, fontsize=9)
        if subtitles[index]:
            axis.set_title(subtitles[index], fontsize=10)
        if index % grid_columns == 0:
            axis.set_ylabel(row_label)
        if index // grid_columns == grid_rows - 1:
            axis.set_xlabel(column_label)
    figure.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    figure.suptitle(title, fontsize=11)
    figure.savefig(path, dpi=120)
    plt.close(figure)
