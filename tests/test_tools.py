"""tools/prepare_batches.py and tools/train_from_batches.py: recorded batches
are exactly those the train command feeds."""

import importlib.util

import numpy as np
import pytest

from helpers import PAIRS, REPO_ROOT
from keras_transformer.training import data


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("split", ["train", "valid"])
def test_recorded_batches_are_the_train_commands(tokenizer, split):
    prepare, train = load_tool("prepare_batches"), load_tool("train_from_batches")
    # Sentences of several lengths, so that batches fall into several buckets.
    sources = [p[0] * n for p in PAIRS for n in (1, 2, 3)]
    targets = [p[1] * n for p in PAIRS for n in (1, 2, 3)]
    pairs = data.tokenize_pairs(sources, targets, tokenizer, max_length=48)
    batching = (
        dict(tokens_per_batch=96, repeat=True, seed=5) if split == "train" else dict(tokens_per_batch=96, shuffle=False)
    )
    steps = 12 if split == "train" else None

    contents = prepare._batch_contents(pairs, steps, **batching)
    arrays = {f"{split}/{k}": v for k, v in {**prepare._token_ids(pairs), **contents}.items()}
    recorded = train.RecordedBatches(arrays, split)

    expected = data.token_batches(pairs, **batching)
    if steps:
        expected = expected.take(steps)
    expected = list(expected.as_numpy_iterator())
    assert len(recorded) == len(expected) > 2
    assert len(set(recorded.encoder_lengths)) > 1
    for index, (x, labels, weights) in enumerate(expected):
        got_x, got_labels, got_weights = recorded.batch(index)
        assert got_x.keys() == x.keys()
        for key in x:
            np.testing.assert_array_equal(got_x[key], x[key], err_msg=f"batch {index}, {key}")
        np.testing.assert_array_equal(got_labels, labels)
        np.testing.assert_array_equal(got_weights, weights)
