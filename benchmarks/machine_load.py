"""How much CPU other processes used while the benchmark ran.

A load average read once at the start misses work that starts later, and
still counts work that ended a minute ago. The kernel's CPU-time counters
(`/proc/stat`) count every process; the benchmark's own share (this process
and every worker it waited for) is known from `getrusage`, so the rest is
what others used, over the whole run.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

# Other processes may use this share of one CPU before a run counts as disturbed:
# a shell, an editor and the kernel's own threads stay well under it.
QUIET_SHARE = 0.05


def machine_cpu_seconds() -> float | None:
    """CPU seconds all processes have used since boot (None where `/proc/stat`
    is missing, as on macOS)."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...
    busy = [int(value) for index, value in enumerate(fields[1:9]) if index not in (3, 4)]
    return sum(busy) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of the children it has waited for."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


@dataclass
class OtherLoad:
    """CPU seconds used by other processes over `wall_seconds`."""

    cpu_seconds: float
    wall_seconds: float

    @property
    def share(self) -> float:
        """Their use as a share of one CPU (1.0: one CPU fully busy)."""
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def quiet(self) -> bool:
        return self.share <= QUIET_SHARE

    def describe(self) -> str:
        return f"{self.share:.1%} of one CPU ({self.cpu_seconds:.0f} CPU-seconds in {self.wall_seconds:.0f} s)"


class OtherLoadMeter:
    """Measures `OtherLoad` from `start()` to `stop()`; the caller's children
    must have been waited for by then.

    Example:
    >>> meter = OtherLoadMeter().start()
    >>> load = meter.stop()
    >>> load is None or load.cpu_seconds >= 0
    True
    """

    def start(self) -> OtherLoadMeter:
        self._machine, self._own, self._wall = machine_cpu_seconds(), own_cpu_seconds(), time.monotonic()
        return self

    def stop(self) -> OtherLoad | None:
        machine = machine_cpu_seconds()
        if machine is None or self._machine is None:
            return None
        others = (machine - self._machine) - (own_cpu_seconds() - self._own)
        # The counters tick at 100 Hz: a small negative is rounding, not work.
        return OtherLoad(max(others, 0.0), time.monotonic() - self._wall)


def sample_other_load(seconds: float = 10.0) -> OtherLoad | None:
    """What other processes use right now, over `seconds` of waiting."""
    meter = OtherLoadMeter().start()
    time.sleep(seconds)
    return meter.stop()
