"""Translate English into German in three lines, with the preset shipped in the package.

What it shows: `Transformer.from_preset` with a registered preset name (offline: the
weights and the SentencePiece vocabulary are package data, checked against their
checksums before use) and `translate`, which runs the paper's beam search (section 6.1:
beam 4, length penalty alpha 0.6, at most source length + 50 tokens). The first call
compiles the search (XLA on TensorFlow), so it takes a few seconds; later calls are fast.

Run:
    python examples/translate.py
    python examples/translate.py "A dog runs across the field." "Two cats sleep."

The same without Python: `keras-transformer translate --preset multi30k_en_de "A dog runs."`
"""

import sys

import keras_transformer

sentences = sys.argv[1:] or ["Two dogs play in the snow.", "A man rides a bike down the street."]

# The three lines: import (above), load, translate.
model = keras_transformer.Transformer.from_preset("multi30k_en_de")
translations = model.translate(sentences)  # a list in, a list out; a str in, a str out

for source, translation in zip(sentences, translations):
    print(f"{source}\t{translation}")
