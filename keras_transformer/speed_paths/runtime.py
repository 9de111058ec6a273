"""One description of the runtime the speed paths are chosen from: backend, device, CPU, cores.

Made once per process (`describe_runtime`); `attach` adds whether the step
being built is compiled (`compiled`). Tests build their own
`Runtime` to choose paths for another machine.

Example:
>>> runtime = Runtime(backend="jax", device="cpu", cpu_flags=frozenset({"avx2"}), cores=2)
>>> runtime.compiles_with_xla, runtime.has_bfloat16_units
(True, False)
"""

import dataclasses
import functools
import os

import keras

# Where the CPU multiplies bfloat16 itself (the flags of Linux's /proc/cpuinfo).
BFLOAT16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
OFF_VARIABLE = "KERAS_TRANSFORMER_SPEED_PATHS_OFF"


@dataclasses.dataclass(frozen=True)
class Runtime:
    """What the speed paths depend on.

    Attributes:
        backend: Keras' backend, `"tensorflow"`, `"jax"` or `"torch"`.
        device: where the backend computes: `"cpu"`, `"gpu"` or `"tpu"`.
        cpu_flags: the CPU's feature flags (empty where unknown).
        cores: the cores this process may run on.
        paths_off: names of speed paths switched off (`"all"` for every one).
        compiled: whether the step the paths are attached for is compiled
            (XLA on TensorFlow and JAX, `torch.compile` on torch).
        training: whether that step is a training step (else a search).
    """

    backend: str
    device: str
    cpu_flags: frozenset = dataclasses.field(default=frozenset(), repr=False)
    cores: int = 1
    paths_off: frozenset = frozenset()
    compiled: bool = False
    training: bool = False

    @property
    def compiles_with_xla(self) -> bool:
        """TensorFlow (under `jit_compile`) and JAX compile through XLA."""
        return self.backend in ("tensorflow", "jax")

    @property
    def under_xla(self) -> bool:
        """The step is compiled, by XLA."""
        return self.compiled and self.compiles_with_xla

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def has_bfloat16_units(self) -> bool:
        """AVX512_BF16 or AMX: the CPU multiplies bfloat16 itself."""
        return bool(BFLOAT16_FLAGS & self.cpu_flags)


def describe_runtime() -> Runtime:
    """The runtime of this process: the machine read once, the paths
    switched off (`KERAS_TRANSFORMER_SPEED_PATHS_OFF`) read now."""
    off = os.environ.get(OFF_VARIABLE, "")
    return dataclasses.replace(_machine(), paths_off=frozenset(name.strip() for name in off.split(",") if name.strip()))


@functools.cache
def _machine() -> Runtime:
    backend = keras.config.backend()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return Runtime(backend=backend, device=_device(backend), cpu_flags=_cpu_flags(), cores=cores)


def _device(backend: str) -> str:
    if backend == "jax":
        import jax

        return jax.default_backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def _cpu_flags() -> frozenset:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return frozenset(next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), []))
    except OSError:
        return frozenset()
