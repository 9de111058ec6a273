"""`python -m keras_transformer.cli`: the command line."""

from keras_transformer.cli.main import command_line

command_line()
