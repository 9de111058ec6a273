"""Subcommands of the `keras-transformer` command line (see `keras_transformer.cli`)."""
