"""Helpers with no model in them: errors, files, special tokens, the text
libraries and every private Keras/KerasHub name the package uses."""
