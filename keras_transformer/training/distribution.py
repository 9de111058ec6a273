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

A training run then looks like this (every process of a multi-host job runs
the same code with its own `process_id`):

    initialize("10.0.0.1:1234", num_processes=2, process_id=0)  # JAX, several hosts
    with training_scope(strategy):
        model = ...  # built and compiled here
        model.compile(loss=GlobalTokenMean(LabelSmoothedCrossEntropy(0.1)), ...)
        model.fit(prepare_dataset(batches, strategy), ...)

What Keras 3.15 does under these strategies, and what this module does
about it (tests/test_distributed.py checks each point):

- Loss scaling: under `"mirrored"`, Keras divides each replica's loss by
  the number of replicas, and a loss with reduction
  `"mean_with_sample_weight"` (like `LabelSmoothedCrossEntropy`) divides by
  the replica's own token count, so the update follows the mean of
  per-replica token means, not the token mean of the global batch
  (`benchmarks/RESULTS.md`). `GlobalTokenMean` divides by the
  global token count instead; two replicas then match one device to 1e-6.
  On JAX the loss is computed on the global batch: no wrapper is needed.
- Batches: token-bucketed batches vary in size and boolean padding masks
  break Keras' mirrored build; `prepare_dataset` pads and casts them.
- Dropout: Keras 3 seeds dropout from one `SeedGenerator` whose state is
  mirrored, so every replica draws the same mask (applied to different
  examples). Training is correct, with less mask diversity than on one
  device; this module does not change Keras' layers.
- Mixed precision: `mixed_float16` (Keras wraps the optimizer in a
  `LossScaleOptimizer` at compile time) and `mixed_bfloat16` train under
  `"mirrored"` without NaNs.
- TensorFlow's `MultiWorkerMirroredStrategy` is refused: with two workers
  on localhost the cluster forms and the data is sharded, but Keras 3's
  `fit` fails building the model from the first batch
  (`strategy.reduce("MEAN", ...)` on the dict of inputs: "Attempt to convert
  a value ({'encoder_token_ids': PerReplica:...}) with an unsupported type
  (<class 'dict'>) to a Tensor.").

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
        # prepare_dataset gives each process its rows; Keras' own sharding
        # needs a fixed batch size, which token-bucketed batches lack.
        return _distribution_scope(keras.distribution.DataParallel(auto_shard_dataset=False))
    if strategy == MULTI_WORKER_MIRRORED:
        raise ValueError(
            "TensorFlow's MultiWorkerMirroredStrategy does not work with Keras 3's model.fit. "
            "To train on several hosts, use the JAX backend (KERAS_BACKEND=jax) with "
            "--strategy jax-data-parallel and --coordinator/--num-processes/--process-id."
        )
    raise ValueError(f"Unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}.")


def prepare_dataset(dataset, strategy: str = "none"):
    """Adapts a batched `tf.data.Dataset` of `(x, y, ...)` to a strategy.

    Call it inside `training_scope(strategy)`. Token-bucketed batches vary
    in size, but every device must get an equal share of each global batch:
    batches are padded with all-padding rows (zeros: pad ids, masks 0,
    labels 0, weights 0, which no loss or metric counts) to a multiple of
    the number of devices. On several JAX processes, every process reads the
    same global batches (same data, same seed) and this keeps the rows of
    its own process; Keras assembles them into the global batch.

    Under `"mirrored"`, boolean tensors also become int32: Keras 3 builds the
    model from the mean over replicas of the first batch
    (`strategy.reduce("MEAN", ...)`), which fails on booleans ("Value for
    attr 'T' of bool is not in the list of allowed values ... AddN").
    `TransformerBackbone` takes int32 padding masks as well.

    With `"none"`, the dataset is returned unchanged.

    Example:
    >>> import tensorflow as tf
    >>> data = tf.data.Dataset.from_tensors(({"mask": [[True, False]]}, [[1, 0]]))
    >>> with training_scope("none"):
    ...     prepare_dataset(data, "none") is data
    True
    """
    if strategy == "none":
        return dataset
    import tensorflow as tf

    if strategy == "mirrored":
        devices, processes, process = tf.distribute.get_strategy().num_replicas_in_sync, 1, 0
    else:
        import jax

        devices, processes, process = jax.device_count(), jax.process_count(), jax.process_index()

    def share(*batch):
        rows = tf.shape(tf.nest.flatten(batch)[0])[0]
        padded_rows = -(-rows // devices) * devices
        per_process = padded_rows // processes

        def pad_and_slice(tensor):
            if strategy == "mirrored" and tensor.dtype == tf.bool:
                tensor = tf.cast(tensor, "int32")
            padding = [[0, padded_rows - rows]] + [[0, 0]] * (len(tensor.shape) - 1)
            tensor = tf.pad(tensor, padding)
            return tensor[process * per_process : (process + 1) * per_process]

        return tf.nest.map_structure(pad_and_slice, batch)

    return dataset.map(share, num_parallel_calls=tf.data.AUTOTUNE)


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


def is_chief() -> bool:
    """Whether this process writes the run's files (process 0 of a JAX job).

    Every process of a multi-host job holds the same weights; only one
    should write checkpoints, logs and presets to a shared folder.
    """
    if keras.config.backend() != "jax":
        return True
    import jax

    return jax.process_index() == 0


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
