"""Training on several devices and hosts: one name per strategy, one scope to train in.

- `"none"`: the default device.
- `"mirrored"`: `tf.distribute.MirroredStrategy` over every visible GPU (or
  the logical CPUs TensorFlow was given); TensorFlow backend only. Keras 3
  needs the model built, compiled and fit inside `strategy.scope()`.
- `"jax-data-parallel"`: `keras.distribution.DataParallel` over all JAX
  devices; JAX backend only. It is set globally with
  `keras.distribution.set_distribution` for the duration of the scope. After
  `initialize(coordinator, num_processes, process_id)` it spans every
  process (host): this is Keras 3's multi-host path.

TensorFlow's `MultiWorkerMirroredStrategy` is refused: Keras 3's `fit`
does not run under it (tests/test_distributed.py records what happens).

Under `"mirrored"`, Keras divides each replica's loss by the number of
replicas, and a loss with reduction `"mean_with_sample_weight"` (like
`LabelSmoothedCrossEntropy`) divides by the replica's own token count: the
update is then the mean of per-replica token means, not the token mean of
the global batch. Wrap the loss in `GlobalTokenMean` to divide by the
global token count instead, which makes training on N replicas match one
device. On JAX the loss is computed on the global batch, so no wrapper is
needed there.

Example:
>>> import keras
>>> with training_scope("none"):
...     model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
"""

import contextlib

import keras
from keras import ops

STRATEGIES = ("none", "mirrored", "jax-data-parallel")
MULTI_WORKER_MIRRORED = "multi-worker-mirrored"


def training_scope(strategy: str = "none") -> contextlib.AbstractContextManager:
    """A context manager to build, compile and fit a model in.

    Entering it gives the `tf.distribute.Strategy`, the
    `keras.distribution.Distribution`, or `None` for `"none"`.

    Args:
        strategy: one of `"none"`, `"mirrored"`, `"jax-data-parallel"`.

    Raises:
        ValueError: for an unknown strategy, or one the Keras backend lacks.
    """
    backend = keras.config.backend()
    if strategy == "none":
        return contextlib.nullcontext()
    if strategy == "mirrored":
        if backend != "tensorflow":
            raise ValueError(
                f"--strategy mirrored needs the TensorFlow backend (KERAS_BACKEND=tensorflow); "
                f"this is {backend}. On JAX use --strategy jax-data-parallel."
            )
        import tensorflow as tf

        return tf.distribute.MirroredStrategy().scope()
    if strategy == "jax-data-parallel":
        if backend != "jax":
            raise ValueError(
                f"--strategy jax-data-parallel needs the JAX backend (KERAS_BACKEND=jax); "
                f"this is {backend}. On TensorFlow use --strategy mirrored."
            )
        return _distribution_scope(keras.distribution.DataParallel())
    if strategy == MULTI_WORKER_MIRRORED:
        raise ValueError(
            "TensorFlow's MultiWorkerMirroredStrategy does not work with Keras 3's model.fit. "
            "To train on several hosts, use the JAX backend (KERAS_BACKEND=jax) with "
            "--strategy jax-data-parallel and --coordinator/--num-processes/--process-id."
        )
    raise ValueError(f"Unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}.")


def prepare_dataset(dataset, strategy: str = "none"):
    """Adapts a batched `tf.data.Dataset` of `(x, y, ...)` to a strategy.

    Under `"mirrored"`, Keras 3 builds the model from the mean over replicas
    of the first batch (`strategy.reduce("MEAN", ...)`), which fails on
    boolean tensors ("Value for attr 'T' of bool is not in the list of
    allowed values ... AddN"); boolean padding masks become int32, which
    `TransformerBackbone` takes as well. Other strategies get the dataset
    unchanged.

    Example:
    >>> import tensorflow as tf
    >>> data = tf.data.Dataset.from_tensors(({"mask": [True, False]}, [1, 0]))
    >>> x, y = next(iter(prepare_dataset(data, "mirrored")))
    >>> x["mask"].dtype.name
    'int32'
    """
    if strategy != "mirrored":
        return dataset
    import tensorflow as tf

    def cast(*batch):
        return tf.nest.map_structure(lambda t: tf.cast(t, "int32") if t.dtype == tf.bool else t, batch)

    return dataset.map(cast, num_parallel_calls=tf.data.AUTOTUNE)


def initialize(coordinator: str, num_processes: int, process_id: int) -> None:
    """Joins this process to a multi-host JAX job; call it before anything else runs.

    Every process runs the same training command with the same
    `coordinator` ("host:port" of process 0) and `num_processes`, and its
    own `process_id` (0 is the coordinator). Afterwards
    `training_scope("jax-data-parallel")` spans the devices of all
    processes, and Keras feeds each process its share of every global batch
    (so global batch sizes must be divisible by `num_processes`).

    This is `keras.distribution.initialize` (which runs
    `jax.distributed.initialize`); on CPU-only hosts it first selects JAX's
    gloo collectives, without which CPUs of different processes cannot
    exchange gradients.

    Raises:
        ValueError: on a backend other than JAX, or inconsistent arguments.
    """
    backend = keras.config.backend()
    if backend != "jax":
        raise ValueError(
            f"Multi-host training needs the JAX backend (KERAS_BACKEND=jax); this is {backend}. "
            "Keras 3 does not train under TensorFlow's MultiWorkerMirroredStrategy."
        )
    if num_processes is None or num_processes < 1:
        raise ValueError(f"--num-processes must be at least 1; got {num_processes}.")
    if process_id is None or not 0 <= process_id < num_processes:
        raise ValueError(f"--process-id must be in [0, {num_processes}); got {process_id}.")
    if not coordinator or ":" not in coordinator:
        raise ValueError(f"--coordinator must be host:port of process 0; got {coordinator!r}.")
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    keras.distribution.initialize(coordinator, num_processes=num_processes, process_id=process_id)


def num_replicas(scope=None) -> int:
    """How many data-parallel replicas a `training_scope`'s value trains on."""
    if scope is None:
        return 1
    if hasattr(scope, "num_replicas_in_sync"):
        return scope.num_replicas_in_sync
    return int(scope.device_mesh.devices.size)


@keras.saving.register_keras_serializable(package="keras_transformer")
class GlobalTokenMean(keras.losses.Loss):
    """A token loss averaged over the global batch under `tf.distribute`.

    Wraps a loss with reduction `"mean_with_sample_weight"` that ignores
    `pad_token_id` labels (`LabelSmoothedCrossEntropy`). Keras 3 scales each
    replica's loss by 1 / replicas; with a per-replica token mean that gives
    `mean_r(sum_r / tokens_r)`, which over-weights the tokens of replicas
    that received short sentences. This wrapper sums the token weights
    across replicas (one all-reduce of a scalar) and returns
    `sum_r / tokens_global`, whose gradients, summed by the strategy, are
    those of the global token mean. Outside a multi-replica context
    (one device, JAX, torch) it returns the wrapped loss unchanged.

    Args:
        loss: the token loss; it must have `pad_token_id`.

    Example:
    >>> import numpy as np
    >>> from keras_transformer import LabelSmoothedCrossEntropy
    >>> loss = GlobalTokenMean(LabelSmoothedCrossEntropy(0.0))
    >>> logits = np.log(np.array([[[0.1, 0.2, 0.7], [0.3, 0.3, 0.4]]], "float32"))
    >>> round(float(loss(np.array([[2, 0]]), logits)), 4)
    0.3567
    """

    def __init__(self, loss: keras.losses.Loss, name: str | None = None, **kwargs):
        super().__init__(name=name or loss.name, **kwargs)
        self.loss = loss

    def __call__(self, y_true, y_pred, sample_weight=None):
        local_mean = self.loss(y_true, y_pred, sample_weight=sample_weight)
        context = _replica_context()
        if context is None:
            return local_mean
        weight = ops.cast(ops.not_equal(y_true, self.loss.pad_token_id), "float32")
        if sample_weight is not None:
            weight = weight * ops.cast(sample_weight, "float32")
        local_tokens = ops.sum(weight)
        global_tokens = context.all_reduce("sum", local_tokens)
        # local_mean is sum_r / tokens_r / replicas (Keras' scaling).
        scale = context.num_replicas_in_sync * ops.divide_no_nan(local_tokens, global_tokens)
        return local_mean * ops.cast(scale, local_mean.dtype)

    def call(self, y_true, y_pred):
        return self.loss.call(y_true, y_pred)

    def get_config(self):
        return {**super().get_config(), "loss": keras.saving.serialize_keras_object(self.loss)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["loss"] = keras.saving.deserialize_keras_object(config["loss"])
        return cls(**config)


def _replica_context():
    """The TensorFlow replica context when several replicas run, else None."""
    if keras.config.backend() != "tensorflow":
        return None
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context


@contextlib.contextmanager
def _distribution_scope(distribution):
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(distribution)
    try:
        yield distribution
    finally:
        keras.distribution.set_distribution(previous)
