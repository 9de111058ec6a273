"""What `Transformer` trains with beyond KerasHub's `fit`: token-id batches, reshuffled arrays, one trace."""

import math

import keras
from keras import ops

from keras_transformer.training.train_step import prepare_train_step
from keras_transformer.utils.text_libraries import tf

TOKEN_ID_KEYS = ("encoder_token_ids", "encoder_padding_mask", "decoder_token_ids")


class TransformerFitting:
    """`Transformer`'s training steps: token ids past the preprocessor, arrays
    reshuffled every epoch, the step prepared where it is built
    (`training.train_step`)."""

    def preprocess_samples(self, x, y=None, sample_weight=None):
        # Token ids (e.g. from `keras_transformer.training.data`) skip the preprocessor.
        if isinstance(x, dict) and all(key in x for key in TOKEN_ID_KEYS):
            return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        return super().preprocess_samples(x, y, sample_weight)

    def fit(
        self,
        x=None,
        y=None,
        batch_size=None,
        sample_weight=None,
        validation_data=None,
        validation_split=None,
        shuffle=True,
        **kwargs,
    ):
        """KerasHub's `fit`, with array-like inputs reshuffled every epoch, as
        Keras shuffles arrays.

        KerasHub batches lists and arrays (of strings or token ids, in dicts
        and tuples) in their order into a dataset, which Keras then cannot
        shuffle; here their examples are shuffled anew each epoch unless
        `shuffle=False`. `validation_split` holds out the last examples
        before shuffling, as Keras does. Datasets are passed on as they are,
        and so is everything on a machine without TensorFlow (which has no
        `tf.data` to shuffle with).
        """
        if not shuffle or tf is None or not _is_array_like(x):
            return super().fit(
                x, y, batch_size, sample_weight, validation_data, validation_split, shuffle=shuffle, **kwargs
            )
        examples = _examples(keras.utils.pack_x_y_sample_weight(x, y, sample_weight))
        if validation_split and validation_data is None:
            examples, validation = _split_off_validation(examples, validation_split)
            validation_data = validation.batch(batch_size or 32)
        elif _is_array_like(validation_data):
            validation_data = _examples(validation_data).batch(batch_size or 32)
        batches = examples.shuffle(len(examples), reshuffle_each_iteration=True).batch(batch_size or 32)
        # Shuffled already: Keras would only warn that it cannot shuffle a dataset.
        return super().fit(batches, validation_data=validation_data, shuffle=False, **kwargs)

    def make_train_function(self, force: bool = False):
        # The step traced next runs with this runtime's speed paths and a built optimizer.
        prepare_train_step(self)
        return super().make_train_function(force)


def _is_array_like(data) -> bool:
    """Lists, tuples, dicts and arrays, which Keras slices and shuffles; not datasets."""
    return isinstance(data, (list, tuple, dict)) or hasattr(data, "__array__")


def _examples(data):
    """`data` (arrays, lists, and dicts or tuples of them) as a `tf.data`
    dataset of examples, converted as KerasHub converts them."""
    leaves = keras.tree.map_structure(
        lambda leaf: ops.convert_to_numpy(leaf) if hasattr(leaf, "__array__") else leaf, data
    )
    return tf.data.Dataset.from_tensor_slices(leaves)


def _split_off_validation(examples, validation_split: float):
    """The first examples to train on and the last `validation_split` of them to validate on."""
    count = len(examples)
    training = math.floor(count * (1.0 - validation_split))
    if training in (0, count):
        raise ValueError(
            f"validation_split={validation_split} of {count} examples leaves none to "
            f"{'train on' if training == 0 else 'validate on'}: give more examples or another split."
        )
    return examples.take(training), examples.skip(training)
