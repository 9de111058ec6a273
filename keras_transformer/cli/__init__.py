"""The `keras-transformer` command line: the entry point (`main`), its
start-up before Keras loads (`startup`) and one module per command."""
