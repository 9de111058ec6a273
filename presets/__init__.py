"""The presets shipped with keras-transformer, one folder each.

This folder installs as the package data `keras_transformer.presets.shipped`
(see `pyproject.toml`), so that the presets load offline from any install.
"""
