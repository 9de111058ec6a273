"""The server's Prometheus metrics, on a registry of its own (`/metrics`).

A registry per app, not prometheus_client's global one, so that two apps in
one process (tests, a Ray replica beside another) count apart.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from keras_transformer.server.batcher import BatchRecord

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class ServerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "translate_request_seconds",
            "Time from a /translate request's arrival to its answer, by status.",
            ["status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.rejected = Counter(
            "translate_rejected_requests",
            "Requests refused, by reason: overloaded (429), deadline (504), invalid (4xx), forbidden (403).",
            ["reason"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "translate_requests_in_flight", "/translate requests being answered.", registry=self.registry
        )
        self.queue_depth = Gauge(
            "translate_queue_sentences", "Sentences waiting to be decoded, by model.", ["model"], registry=self.registry
        )
        self.batch_sentences = Histogram(
            "translate_batch_sentences",
            "Sentences in each decoded batch, by model.",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.batch_requests = Histogram(
            "translate_batch_requests",
            "Requests whose sentences shared each decoded batch, by model.",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.batch_seconds = Histogram(
            "translate_batch_seconds",
            "Time to decode each batch, by model.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def watch_queue(self, model: str, batcher) -> None:
        """Reports `batcher`'s queue depth under `model` at each scrape."""
        self.queue_depth.labels(model).set_function(lambda: batcher.queue_depth)

    def batch_recorder(self, model: str):
        """An `on_batch` callback for the batcher of `model`."""

        def record(batch: BatchRecord) -> None:
            self.batch_sentences.labels(model).observe(batch.sentences)
            self.batch_requests.labels(model).observe(batch.requests)
            self.batch_seconds.labels(model).observe(batch.seconds)

        return record
