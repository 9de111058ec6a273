"""Batching sentences across requests: one worker thread per model runs batches back to back.

Requests hand their sentences (token ids) to `Batcher.submit` and get a
future of their translations. The worker takes sentences of one source width
(`engine.bucket_of`), oldest first, and decodes them together as soon as a
batch is full (`engine.rows_per_batch`) or its oldest sentence has waited
`max_wait_ms`; while a batch decodes, the next one fills. Each request gets
its own sentences back, in order. (Ray Serve's `@serve.batch` batches whole
calls, not the sentences inside them; the Ray deployment uses this class.)

Backpressure: at most `max_queue` sentences wait; beyond that `submit`
raises `Overloaded` (the server's 429), so latency stays bounded. A request
of more sentences than `max_queue` is refused at once (`TooManySentences`,
413). A request past its deadline (`DeadlineExceeded`, 504), cancelled, or
whose batch failed leaves the queue rather than being decoded for nobody.

Example:
>>> class Upper:  # an engine: widths, batch limits, and a batch of rows to texts
...     def bucket_of(self, row): return 16
...     def rows_per_batch(self, bucket): return 8
...     def translate_rows(self, rows): return ["".join(row).upper() for row in rows]
>>> batcher = Batcher(Upper(), max_wait_ms=1)
>>> batcher.start()
>>> batcher.submit([["a", "b"], ["c"]]).result()
['AB', 'C']
>>> batcher.stop()
"""

import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


class Overloaded(RuntimeError):
    """The queue is full; `retry_after` is a guess, in seconds, of when it has room."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class TooManySentences(ValueError):
    """A request holds more sentences than the queue holds at all; waiting cannot help."""


class DeadlineExceeded(TimeoutError):
    """A request's sentences were still waiting at its deadline."""


class Stopped(RuntimeError):
    """The batcher has stopped taking work (the server is shutting down)."""


@dataclass(eq=False)
class _Job:
    """One request's sentences, their translations so far, and its future."""

    rows: list
    deadline: float
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    results: list = field(default_factory=list)
    remaining: int = 0


@dataclass(eq=False)
class _Sentence:
    job: _Job
    position: int
    arrival: float


@dataclass(frozen=True)
class BatchRecord:
    """What `on_batch` hears of each decoded batch."""

    sentences: int
    requests: int
    width: int
    seconds: float


class Batcher:
    """The sentences of concurrent requests, decoded in shared batches by one thread.

    Args:
        engine: has `bucket_of(row)`, `rows_per_batch(width)` and
            `translate_rows(rows) -> list[str]` (a `ModelEngine`).
        max_wait_ms: how long a sentence may wait for others to fill its batch.
        max_queue: the most sentences waiting; more are refused (`Overloaded`).
        timeout_s: the default deadline of a request, from its submission.
        on_batch: called by the worker with a `BatchRecord` after each batch
            is decoded, before its requests are answered.
    """

    def __init__(
        self,
        engine,
        *,
        max_wait_ms: float = 5.0,
        max_queue: int = 1024,
        timeout_s: float = 30.0,
        on_batch: Callable[[BatchRecord], None] | None = None,
    ):
        self.engine = engine
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.on_batch = on_batch
        self._waiting: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._depth = 0
        self._condition = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._sentences_per_second = None  # a running average, for Retry-After

    @property
    def queue_depth(self) -> int:
        """Sentences waiting to be decoded."""
        return self._depth

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="batcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Takes no more work, decodes everything waiting, and ends the worker."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, rows: list, timeout_s: float | None = None) -> concurrent.futures.Future:
        """Queues one request's sentences; the future gives their translations, in order.

        Raises:
            TooManySentences: `rows` alone are more than `max_queue`.
            Overloaded: the queue has no room for `rows` now.
            Stopped: the batcher is shutting down.
        """
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        job = _Job(rows=list(rows), deadline=deadline, results=[None] * len(rows), remaining=len(rows))
        if not rows:
            job.future.set_result([])
            return job.future
        if len(rows) > self.max_queue:
            raise TooManySentences(
                f"The request holds {len(rows)} sentences, more than the {self.max_queue} the server queues at "
                f"once: send it in parts of at most {self.max_queue} sentences."
            )
        with self._condition:
            if self._stopping:
                raise Stopped("The server is shutting down and takes no new requests.")
            if self._depth + len(rows) > self.max_queue:
                raise Overloaded(
                    f"The server is busy: {self._depth} sentences are waiting (at most {self.max_queue}). "
                    "Retry shortly.",
                    self._retry_after(),
                )
            now = time.monotonic()
            for position, row in enumerate(job.rows):
                self._waiting[self.engine.bucket_of(row)].append(_Sentence(job, position, now))
            self._depth += len(rows)
            self._condition.notify()
        return job.future

    def cancel(self, future: concurrent.futures.Future) -> None:
        """Drops the waiting sentences of the request of `future` (its client gave up)."""
        with self._condition:
            self._remove(lambda sentence: sentence.job.future is future)
        future.cancel()

    def _retry_after(self) -> float:
        rate = self._sentences_per_second
        return 1.0 if not rate else max(1.0, self._depth / rate)

    def _remove(self, doomed: Callable[[_Sentence], bool]) -> None:
        for width, queue in list(self._waiting.items()):
            kept = collections.deque(s for s in queue if not doomed(s))
            self._depth -= len(queue) - len(kept)
            self._waiting[width] = kept

    def _drop_expired(self, now: float) -> None:
        expired = {s.job for queue in self._waiting.values() for s in queue if s.job.deadline <= now}
        if expired:
            self._remove(lambda sentence: sentence.job in expired)
            for job in expired:
                _settle(job.future, error=DeadlineExceeded("The deadline passed before its sentences were translated."))

    def _next_batch(self) -> tuple[int, list[_Sentence]] | None:
        """Waits for a batch to be due and takes it; `None` once stopped and empty."""
        with self._condition:
            while True:
                now = time.monotonic()
                self._drop_expired(now)
                queues = {width: queue for width, queue in self._waiting.items() if queue}
                if not queues:
                    if self._stopping:
                        return None
                    self._condition.wait()
                    continue
                width = min(queues, key=lambda w: queues[w][0].arrival)
                queue, size = queues[width], self.engine.rows_per_batch(width)
                due = queue[0].arrival + self.max_wait
                if len(queue) < size and now < due and not self._stopping:
                    self._condition.wait(due - now)
                    continue
                batch = [queue.popleft() for _ in range(min(size, len(queue)))]
                self._depth -= len(batch)
                return width, batch

    def _work(self) -> None:
        while (taken := self._next_batch()) is not None:
            width, batch = taken
            started = time.monotonic()
            try:
                translations = self.engine.translate_rows([s.job.rows[s.position] for s in batch])
            except Exception as error:  # the batch's requests get the error, the worker goes on
                self._fail({s.job for s in batch}, error)
                continue
            seconds = time.monotonic() - started
            self._record(len(batch) / max(seconds, 1e-6))
            # Recorded before any answer leaves: a client that reads /metrics
            # after its answer finds its batch counted.
            if self.on_batch is not None:
                self.on_batch(BatchRecord(len(batch), len({s.job for s in batch}), width, seconds))
            for sentence, text in zip(batch, translations):
                job = sentence.job
                job.results[sentence.position] = text
                job.remaining -= 1
                if job.remaining == 0:
                    _settle(job.future, result=job.results)

    def _fail(self, jobs: set[_Job], error: Exception) -> None:
        """Settles `jobs` with `error`; their other sentences leave the queue (decoded, they would reach nobody)."""
        with self._condition:
            self._remove(lambda sentence: sentence.job in jobs)
        for job in jobs:
            _settle(job.future, error=error)

    def _record(self, rate: float) -> None:
        previous = self._sentences_per_second
        self._sentences_per_second = rate if previous is None else 0.8 * previous + 0.2 * rate


def _settle(future: concurrent.futures.Future, result=None, error: BaseException | None = None) -> None:
    """Sets a future's outcome unless its client cancelled it meanwhile."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass
