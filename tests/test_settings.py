"""The paper's defaults live in `SearchSettings` and `TrainingRecipe`; everything takes them from there."""

import argparse

import pytest

import keras_transformer as kt
from keras_transformer.cli.commands import train as train_command
from keras_transformer.cli.search_options import add_search_arguments, search_settings
from keras_transformer.training.recipe import TrainingRecipe
from keras_transformer.training_run import Trainer


def test_search_settings_are_section_6_1s_and_checked():
    paper = kt.SearchSettings()
    assert (paper.beam_size, paper.alpha, paper.max_extra_length) == (4, 0.6, 50)
    bad_values = ((dict(beam_size=0), "beam_size"), (dict(alpha=-1.0), "alpha"), (dict(max_extra_length=-1), "max_"))
    for bad, name in bad_values:
        with pytest.raises(ValueError, match=name):
            kt.SearchSettings(**bad)
    # "auto" and None keep a field; beam_size=None is greedy search.
    settings = kt.SearchSettings(beam_size=5, alpha=1.0)
    assert settings.overridden() == settings
    assert settings.overridden(beam_size=None, max_extra_length=3) == kt.SearchSettings(None, 1.0, 3)


def test_command_line_search_flags_default_to_the_settings():
    parser = argparse.ArgumentParser()
    add_search_arguments(parser, greedy=True)
    assert search_settings(parser.parse_args([])) == kt.SearchSettings()
    assert search_settings(parser.parse_args(["--greedy", "--alpha", "0"])) == kt.SearchSettings(None, 0.0)


def test_training_defaults_come_from_the_recipe(tokenizer):
    recipe = TrainingRecipe()
    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    args = parser.parse_args(["--src", "s", "--out", "o"])
    assert (args.warmup_steps, args.label_smoothing, args.peak_lr) == (
        recipe.warmup_steps,
        recipe.label_smoothing,
        recipe.peak_learning_rate,
    )
    backbone = kt.TransformerBackbone(tokenizer.vocabulary_size(), 1, 1, 2, 16, 32)
    assert backbone.dropout == recipe.dropout
    for compile_model in (lambda model: model.compile(), Trainer("run", recipe, max_steps=1).compile):
        model = kt.Transformer(backbone)
        compile_model(model)
        optimizer = model.optimizer
        assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (recipe.beta_1, recipe.beta_2, recipe.epsilon)
        assert model.loss.label_smoothing == recipe.label_smoothing


def test_recipe_refuses_bad_values():
    with pytest.raises(ValueError, match="accumulate"):
        TrainingRecipe(accumulate=0)
    with pytest.raises(ValueError, match="label_smoothing"):
        TrainingRecipe(label_smoothing=1.0)


def test_search_settings_and_keywords_decode_alike(trained_model):
    sources = ["a dog runs .", "two cats play ."]
    by_keywords = trained_model.translate(sources, beam_size=2, alpha=0.0)
    assert trained_model.translate(sources, search=kt.SearchSettings(beam_size=2, alpha=0.0)) == by_keywords
    # A keyword overrides the field of the settings given.
    greedy = trained_model.translate(sources, beam_size=None)
    assert trained_model.translate(sources, search=kt.SearchSettings(beam_size=3), beam_size=None) == greedy
    assert (kt.SearchSettings(beam_size=2, alpha=0.0), True) in trained_model.compiled_searches
