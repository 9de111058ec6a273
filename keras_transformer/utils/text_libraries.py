"""TensorFlow and tensorflow-text: text processing needs them, the models do not.

The tokenizers, preprocessors and the `tf.data` pipeline use TensorFlow on
every Keras backend (as KerasHub's do); the layers, backbone, search and
training step do not. Modules import the libraries from here, so that on a
machine with only JAX or PyTorch (a GPU box without TensorFlow) the models
still import and run, and using text processing says what is missing, as
KerasHub's `assert_tf_libs_installed` does for its own tokenizers.
"""

try:
    import tensorflow as tf
except ImportError:
    tf = None
try:
    import tensorflow_text as tf_text
except ImportError:
    tf_text = None


def require_text_libraries(user: str) -> None:
    """Raises an `ImportError` naming `user` if either library is missing."""
    if tf is None or tf_text is None:
        raise ImportError(
            f"{user} needs `tensorflow` and `tensorflow-text` to process text, on every Keras backend. "
            "Install them with `pip install tensorflow-text` (it brings TensorFlow; a CPU build is enough). "
            "Models given token ids need neither."
        )
