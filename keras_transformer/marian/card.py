"""The model card of a converted Marian checkpoint."""

import re

from keras_transformer.marian.hub import CheckpointFiles
from keras_transformer.models.transformer_backbone import TransformerBackbone
from keras_transformer.presets import model_card as cards

README = "README.md"
_LICENSE = re.compile(r"^license:\s*(\S+)\s*$", re.MULTILINE)


def source_license(files: CheckpointFiles) -> str | None:
    """The `license:` of the source repo's model card, if it has one."""
    try:
        path = files(README)
    except OSError:
        return None
    if path is None:
        return None
    match = _LICENSE.search(path.read_text(encoding="utf-8", errors="replace"))
    return match.group(1) if match else None


def _vocabulary_row(backbone: TransformerBackbone) -> str:
    if backbone.target_vocabulary_size is None:
        return f"{backbone.vocabulary_size:,} pieces: source and target SentencePiece models, one vocab.json"
    return (
        f"{backbone.vocabulary_size:,} source and {backbone.target_vocabulary_size:,} target pieces: two "
        "SentencePiece models, vocab.json and target_vocab.json (the output projection is tied to the target's)"
    )


def model_card(
    handle: str, name: str, backbone: TransformerBackbone, license_id: str | None, weights_dtype: str = "float32"
) -> str:
    """A card that says whose weights these are, under what license, and how
    the architecture differs from the paper's."""
    license_id = license_id or "other"
    rows = [
        ("layers (encoder + decoder)", f"{backbone.num_encoder_layers} + {backbone.num_decoder_layers}"),
        ("d_model, d_ff, heads", f"{backbone.hidden_dim}, {backbone.intermediate_dim}, {backbone.num_heads}"),
        ("FFN activation", f"{backbone.activation} (the paper: relu)"),
        ("vocabulary", _vocabulary_row(backbone)),
        ("sinusoids", "all sines, then all cosines (the paper interleaves them)"),
        ("output projection", "tied embeddings plus a learned logits bias (the paper: no bias)"),
        ("special tokens", "`</s>` ends every sequence; `<pad>` starts the decoder and is never generated"),
        ("LayerNorm epsilon", backbone.layer_norm_epsilon),
        ("parameters", f"{backbone.count_params():,}"),
        ("weights dtype", weights_dtype),
    ]
    introduction = f"""A Marian (Opus-MT) translation model converted from `{handle}` by
`keras-transformer convert`, into a keras-transformer preset (Keras 3;
TensorFlow, JAX and PyTorch backends) that loads without conversion.

- **Whose weights.** The authors of `{handle}` (for Helsinki-NLP's Opus-MT
  models: Jörg Tiedemann, Santhosh Thottingal and the Language Technology
  Research Group at the University of Helsinki; cite "OPUS-MT — Building open
  translation services for the World", EAMT 2020).
- **License.** `{license_id}`, as the source model card states; Opus-MT
  weights are mostly CC-BY-4.0, which requires attribution.
- **Data and scores.** See the source model card at `{handle}`: the training
  data (OPUS) and the BLEU scores the authors publish, with their test sets.
  The conversion is exact (logits equal `transformers`' `MarianMTModel`'s to
  1e-4), so those scores carry over up to decoding settings."""
    architecture = f"""{cards.architecture_table(rows)}

Post-LN layers, scaled shared embeddings and static sinusoidal positions are
the paper's ("Attention Is All You Need", Vaswani et al., 2017)."""
    use = f"""```python
import keras_transformer

model = keras_transformer.Transformer.from_preset("path/to/{name}")
print(model.translate(["Two dogs play in the snow."]))
```"""
    return cards.model_card(
        name, introduction, [("Architecture", architecture), ("Use", use)], license_id=license_id, tags=["marian"]
    )
