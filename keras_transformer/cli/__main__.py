"""`python -m keras_transformer.cli`: the command line."""

import sys

from keras_transformer.cli.main import main

sys.exit(main())
