"""TensorFlow and tensorflow-text: `tf.data` pipelines need them, the models do not.

The `tf.data` pipelines, and tokenizers inside them or inside a SavedModel,
use TensorFlow on every Keras backend (as KerasHub's do); elsewhere the
tokenizers work without it (with `sentencepiece`), and the layers, backbone,
search and training step never use it. Modules import the libraries from
here, so that on a machine with only JAX or PyTorch (a GPU box without
TensorFlow) the models still import and run, and a pipeline that needs them
says what is missing, as KerasHub's `assert_tf_libs_installed` does.
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
