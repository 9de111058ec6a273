"""Training on several devices and hosts: one name per strategy, one scope to train in.

- `"none"`: the default device.
- `"mirrored"`: `tf.distribute.MirroredStrategy` over every visible GPU (or
  the logical CPUs TensorFlow was given); TensorFlow only.
- `"jax-data-parallel"`: `keras.distribution.DataParallel` over all JAX
  devices, and over every host after `initialize(...)`; JAX only.

Every process of a multi-host job runs the same code with its own `process_id`:

    initialize("10.0.0.1:1234", num_processes=2, process_id=0)  # JAX, several hosts
    with training_scope(strategy):
        model = ...  # built and compiled here
        model.compile(loss=GlobalTokenMean(LabelSmoothedCrossEntropy(0.1)), ...)
        model.fit(prepare_dataset(batches, strategy), ...)

Under `"mirrored"`, Keras 3 averages per-replica token means: `GlobalTokenMean`
divides by the global batch's tokens instead, and `prepare_dataset` pads
token-bucketed batches to a share per device. Dropout draws the same mask on
every replica (Keras mirrors its seed); this module leaves Keras' layers as
they are. `tests/test_distributed.py` checks each point.

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
        # Keras 3's fit builds the model from `strategy.reduce("MEAN", ...)` of
        # the first batch, which fails on a dict of per-replica inputs.
        raise ValueError(
            "TensorFlow's MultiWorkerMirroredStrategy does not work with Keras 3's model.fit. "
            "To train on several hosts, use the JAX backend (KERAS_BACKEND=jax) with "
            "--strategy jax-data-parallel and --coordinator/--num-processes/--process-id."
        )
    raise ValueError(f"Unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}.")


def prepare_dataset(dataset, strategy: str = "none", *, per_process: bool = False, micro_batches: int = 1):
    """Adapts a batched `tf.data.Dataset` of `(x, y, ...)` to a strategy.

    Call it inside `training_scope(strategy)`. Token-bucketed batches vary
    in size, but every device must get an equal share of each global batch:
    batches are padded with all-padding rows (zeros: pad ids, masks 0,
    labels 0, weights 0, which no loss or metric counts) to a multiple of
    the number of devices. On several JAX processes, every process reads the
    same global batches (same data, same seed) and this keeps the rows of
    its own process; Keras assembles them into the global batch.

    With `per_process`, `dataset` holds only this process's share of the
    data (e.g. `prepared_batches` of its own shards): on several JAX
    processes the result is then a generator of the batches padded at each
    step to one shape agreed by all processes (see `_agreed_batches`); it
    ends when every process's data has ended.

    With `micro_batches` K > 1 (gradient accumulation), each update's K
    batches get the token weights of `data.weight_by_update`: a token
    weighs K / (real tokens of the update, in every process).

    Under `"mirrored"`, boolean tensors also become int32: Keras 3 builds the
    model from the mean over replicas of the first batch, which fails on
    booleans; `TransformerBackbone` takes int32 padding masks as well.

    With `"none"`, the dataset is returned unchanged.

    Example:
    >>> import tensorflow as tf
    >>> data = tf.data.Dataset.from_tensors(({"mask": [[True, False]]}, [[1, 0]]))
    >>> with training_scope("none"):
    ...     prepare_dataset(data, "none") is data
    True
    """
    import tensorflow as tf

    from keras_transformer.training.data import weight_by_update

    if strategy == "mirrored":
        devices, processes, process = tf.distribute.get_strategy().num_replicas_in_sync, 1, 0
    elif strategy == "jax-data-parallel":
        import jax

        devices, processes, process = jax.device_count(), jax.process_count(), jax.process_index()
        if per_process and processes > 1:
            return _agreed_batches(dataset, devices // processes, micro_batches)
    if micro_batches > 1:
        dataset = weight_by_update(dataset, micro_batches)
    if strategy == "none":
        return dataset

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


def _agreed_batches(dataset, local_devices: int, micro_batches: int = 1):
    """Each process's own batches, padded at every step to the shape of all processes' largest.

    Keras makes the global batch of the processes' local batches
    (`jax.make_array_from_process_local_data`), which must have one shape;
    batches bucketed from different shards differ in rows and lengths. So
    the processes all-gather their batches' dimensions (a few numbers) and
    pad to the largest, rows to a multiple of the local devices, with zeros:
    pad ids, masks 0, labels 0, weights 0, which no loss or metric counts. A
    process whose data has ended gives all-padding batches until every
    process's has. This is a generator that Keras iterates in its training
    loop's thread, so the all-gathers keep their order among the training
    steps' collectives in every process (in a tf.data thread they could
    interleave differently and deadlock).

    With `micro_batches` K > 1, batches are agreed K at a time and weighted
    as `data.weight_by_update` weights them, by the tokens of the whole
    update in all processes.
    """
    import numpy as np
    import tensorflow as tf
    from jax.experimental import multihost_utils

    specs = tf.nest.flatten(dataset.element_spec)
    batches = dataset.as_numpy_iterator()
    while True:
        group = [next(batches, None) for _ in range(micro_batches)]
        arrays = [tf.nest.flatten(batch) if batch is not None else None for batch in group]
        # Per batch: whether there is one, its token weights (the last array), its dimensions.
        numbers = [
            [1, a[-1].sum(), *(d for array in a for d in array.shape)]
            if a
            else [0, 0] + [0] * sum(spec.shape.rank for spec in specs)
            for a in arrays
        ]
        gathered = multihost_utils.process_allgather(np.array(numbers, "float64"))  # processes, batches, numbers
        if not gathered[..., 0].any(axis=0).all():
            return  # every process's data has ended (or, as weight_by_update, a last incomplete update)
        scale = micro_batches / gathered[..., 1].sum()
        for index, a in enumerate(arrays):
            largest = iter(gathered[:, index, 2:].max(axis=0).astype(int).tolist())
            shapes = [[next(largest) for _ in range(spec.shape.rank)] for spec in specs]
            for shape in shapes:
                shape[0] = -(-shape[0] // local_devices) * local_devices
            if a is None:
                a = [np.zeros([0] * len(shape), spec.dtype.as_numpy_dtype) for spec, shape in zip(specs, shapes)]
            a = [np.pad(array, [(0, n - d) for n, d in zip(shape, array.shape)]) for array, shape in zip(a, shapes)]
            if micro_batches > 1:
                a[-1] = a[-1].astype("float32") * np.float32(scale)
            yield tf.nest.pack_sequence_as(dataset.element_spec, a)


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


def processes(strategy: str) -> tuple[int, int]:
    """How many processes train together and which one this is: `(1, 0)` but
    under `"jax-data-parallel"` across several processes."""
    if strategy != "jax-data-parallel":
        return 1, 0
    import jax

    return jax.process_count(), jax.process_index()


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
