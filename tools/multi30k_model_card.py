"""Writes the model card (README.md) of a shipped Multi30k preset from its run.

Every number in the card is read from the files the project's tools wrote:
`run.json` and `curves.csv` of the training run, and the `evaluate --json`
results for the float16 (shipped) and float32 weights. The example output is
translated by the preset itself. The card speaks to the model's users: what
it translates, the data and recipe, the scores with their sacreBLEU
signatures, and its limits.

Usage (after tools/train_multi30k.sh, or its three commands run by hand):

    python tools/multi30k_model_card.py --run runs/multi30k_en_de --preset presets/multi30k_en_de
"""

import argparse
import csv
import json
from pathlib import Path

LANGUAGES = {"de": "German", "fr": "French"}
LANGUAGE_CODES = {name: code for code, name in LANGUAGES.items()}
EXAMPLE = "Two dogs play in the snow."
RECIPE_UPDATES = 8000
# Wu et al., "Good for Misconceived Reasons: An Empirical Revisiting on the Need for Visual Context
# in Multimodal Machine Translation" (ACL 2021): text-only Transformer-Tiny, this recipe, beam 5,
# lower-cased Moses-tokenized test_2016_flickr. Only English-German is published.
PUBLISHED_LC_TOK_BLEU = {"de": 41.02}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, type=Path, help="the training run folder")
    parser.add_argument("--preset", required=True, type=Path, help="the averaged preset folder")
    parser.add_argument("--status", default="", help="a paragraph for users on how complete the training is")
    parser.add_argument("--last", type=int, default=10, help="how many checkpoints were averaged")
    args = parser.parse_args()
    (args.preset / "README.md").write_text(model_card(args), encoding="utf-8")
    print(f"wrote {args.preset / 'README.md'}")


def model_card(args: argparse.Namespace) -> str:
    import keras_transformer as kt
    from keras_transformer.presets import model_card as cards

    run = json.loads((args.run / "run.json").read_text())
    arguments = run["arguments"]
    lang = arguments["tgt"].split(".")[-2]
    language = LANGUAGES[lang]
    scores = {
        dtype: json.loads((args.run / f"test_2016_flickr.{dtype}.json").read_text()) for dtype in ("float16", "float32")
    }
    model = kt.Transformer.from_preset(str(args.preset))
    backbone = model.backbone  # the architecture as shipped, defaults included
    example = model.translate([EXAMPLE])[0]
    name = args.preset.name
    weights_mb = (args.preset / "model.weights.h5").stat().st_size / 1e6
    introduction = f"""English-to-{language} translation of short image descriptions, trained with this project's
tools on Multi30k; ships inside the `keras-transformer` package and loads offline:

```python
import keras_transformer
model = keras_transformer.Transformer.from_preset("{name}")
print(model.translate(["{EXAMPLE}"]))   # {[example]}
```

{args.status}"""
    architecture = f"""The paper's Post-LN encoder-decoder at the size of Wu et al. (2021)'s Transformer-Tiny:
{backbone.num_encoder_layers} + {backbone.num_decoder_layers} layers, d_model {backbone.hidden_dim}, \
d_ff {backbone.intermediate_dim}, {backbone.num_heads} heads, dropout {backbone.dropout} on sublayer
outputs and embedding sums and {backbone.attention_dropout} on attention weights (section 5.4), one
shared {backbone.vocabulary_size:,}-piece SentencePiece BPE vocabulary trained on the cased English and
{language} training text, tied embeddings and output projection, sinusoidal positions;
{backbone.count_params():,} parameters, stored as float16 ({weights_mb:.1f} MB, loaded as float32)."""
    recipe = f"""Multi30k task 1: `train` (29,000 pairs) for training, `val` (1,014) for validation,
`test_2016_flickr` (1,000) only for the final score. Cased, untokenized text.
Adam(0.9, 0.98, 1e-9), inverse square-root schedule with {arguments["warmup_steps"]:,} warmup steps and a
peak of {arguments["peak_lr"]}, label smoothing {arguments["label_smoothing"]}, batches of about \
{arguments["tokens_per_batch"]:,} source and
{arguments["tokens_per_batch"]:,} target token positions, checkpoints every \
{arguments["checkpoint_every_steps"]} updates (about one epoch), the last
{args.last} averaged.

Commands (`LAST={args.last} tools/train_multi30k.sh {lang}` runs them; the data is `../shared/data/multi30k`):

```bash
keras-transformer train --src raw/train.en.gz --tgt raw/train.{lang}.gz \\
    --valid-src raw/val.en.gz --valid-tgt raw/val.{lang}.gz \\
    --preset {arguments["preset"]} --vocab-size {arguments["vocab_size"]} \
--tokens-per-batch {arguments["tokens_per_batch"]} --max-steps {arguments["max_steps"]} \\
    --warmup-steps {arguments["warmup_steps"]} --peak-lr {arguments["peak_lr"]} \
--label-smoothing {arguments["label_smoothing"]} \\
    --checkpoint-every-steps {arguments["checkpoint_every_steps"]} --checkpoint-every-minutes 0 \
--keep-checkpoints {arguments["keep_checkpoints"]} \\
    --valid-every {arguments["valid_every"]} --seed {arguments["seed"]} --out {args.run}
keras-transformer average {args.run} --last {args.last} --out presets/{name} --weights-dtype float16
keras-transformer evaluate presets/{name} --src raw/test_2016_flickr.en.gz \\
    --ref raw/test_2016_flickr.{lang}.gz --ref-tok tok/test_2016_flickr.lc.norm.tok.{lang}.gz \\
    --beam-size 5 --alpha 0.6
```

Training curves (validation on `val`):

{_curves_table(args.run / "curves.csv")}"""
    scores_text = f"""{_scores_table(scores, lang)}

sacreBLEU signatures: `{scores["float16"]["bleu_signature"]}`;
lower-cased tokenized: `{scores["float16"]["lc_tok_bleu_signature"]}|pre:{scores["float16"]["lc_tok_preprocessing"]}`.
Float16 storage changes sacreBLEU by \
{scores["float16"]["bleu"] - scores["float32"]["bleu"]:+.2f} and halves the weights file."""
    return cards.model_card(
        f"{name}: a small English→{language} Transformer trained on Multi30k",
        introduction,
        [
            ("Architecture", architecture),
            ("Data and recipe", recipe),
            ("Scores on test_2016_flickr (beam 5, alpha 0.6)", scores_text),
            ("Limitations", limitations(language, backbone.count_params())),
            ("License", "Apache-2.0 (model); Multi30k's own terms apply to the data."),
        ],
        languages=["en", lang],
        datasets=["multi30k"],
    )


def limitations(language: str, parameters: int) -> str:
    """What the model is not good for, said to its users."""
    return f"""- It knows the domain of its training data: short descriptions of everyday photographs
  (Flickr30k captions). News, dialogue or technical text come out much worse, and words the
  captions never use are split into subwords the model rarely saw.
- It is small ({parameters:,} parameters) and trained on 29,000 sentence pairs: for general
  English→{language} translation, an Opus-MT preset trained on far more data \
(`base_en_{LANGUAGE_CODES[language]}`, `big_en_{LANGUAGE_CODES[language]}`) is the better choice.
- It reads and writes cased, untokenized text; scores on lower-cased tokenized text (as much of
  the Multi30k literature reports them) are not the same measure as sacreBLEU.
- Multi30k's descriptions carry the biases of the photographs and of their annotators."""


def _curves_table(path: Path) -> str:
    rows = [
        "| update | training loss | validation loss (label-smoothed, nats) | validation accuracy "
        "| validation BLEU (200 sentences, greedy) |",
        "| --- | --- | --- | --- | --- |",
    ]
    with open(path) as f:
        for row in csv.DictReader(f):
            bleu = row.get("val_bleu") or ""
            bleu = f"{float(bleu):.1f}" if bleu else ""
            rows.append(
                f"| {int(float(row['step'])):,} | {float(row['loss']):.2f} | {float(row['val_loss']):.2f} "
                f"| {float(row['val_accuracy']):.3f} | {bleu} |"
            )
    return "\n".join(rows)


def _scores_table(scores: dict, lang: str) -> str:
    rows = [
        "| weights | sacreBLEU (cased, 13a) | chrF2 | BLEU, lower-cased Moses-tokenized |",
        "| --- | --- | --- | --- |",
    ]
    for dtype, label in (("float16", "float16 (shipped)"), ("float32", "float32")):
        s = scores[dtype]
        rows.append(f"| {label} | {s['bleu']:.2f} | {s['chrf']:.2f} | {s['lc_tok_bleu']:.2f} |")
    if lang in PUBLISHED_LC_TOK_BLEU:
        rows.append(
            f"| Wu et al. 2021, Transformer-Tiny, {RECIPE_UPDATES:,} updates | | | {PUBLISHED_LC_TOK_BLEU[lang]} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    main()
