"""The examples in the docstrings run and print what they say."""

import doctest
import importlib
import pkgutil

import pytest

import keras_transformer


def modules_with_examples():
    for info in pkgutil.walk_packages(keras_transformer.__path__, "keras_transformer."):
        # The shipped presets are data; running `__main__` would start the command line.
        if info.name.startswith("keras_transformer.presets.shipped") or info.name.endswith(".__main__"):
            continue
        module = importlib.import_module(info.name)
        if any(test.examples for test in doctest.DocTestFinder().find(module)):
            yield info.name


@pytest.mark.parametrize("name", sorted(modules_with_examples()))
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
