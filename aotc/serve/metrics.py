"""The server's Prometheus metrics (one registry per server) and its structured access log.

Latencies are histograms, so P50/P90/P99 follow from them in Prometheus
(``histogram_quantile(0.99, rate(aotc_request_seconds_bucket[1m]))``)."""

from __future__ import annotations

import json
import logging
import sys
import time

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

# 0.5 ms to 60 s: a small model answers in well under a millisecond, a queue under a burst
# takes seconds
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10,
                    30, 60)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)

ACCESS_LOG = logging.getLogger("aotc.serve.access")


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, CPU seconds
        r = self.registry
        self.requests = Counter("aotc_requests", "Inference requests answered, by outcome",
                                ["model", "protocol", "outcome"], registry=r)
        self.errors = Counter("aotc_request_errors", "Requests refused or failed, by error type",
                              ["model", "type"], registry=r)
        self.latency = Histogram("aotc_request_seconds", "Request latency, arrival to answer",
                                 ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("aotc_queue_seconds", "Time a request waited for its batch",
                               ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.compute = Histogram("aotc_compute_seconds", "Model run time per batch",
                                 ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.batch = Histogram("aotc_batch_size", "Requests per model run", ["model"],
                               buckets=_BATCH_BUCKETS, registry=r)
        self.inflight = Gauge("aotc_inflight_requests", "Requests received and not yet answered",
                              ["model"], registry=r)
        self.queued = Gauge("aotc_queued_requests", "Requests waiting for a batch", ["model"],
                            registry=r)
        self.stage = Histogram("aotc_stage_seconds", "Pipeline stage latency",
                               ["pipeline", "stage"], buckets=_LATENCY_BUCKETS, registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def answered(self, model: str, protocol: str, outcome: str, started: float,
                 error_type: str | None = None, request_id: str = "") -> None:
        seconds = time.perf_counter() - started
        self.requests.labels(model, protocol, outcome).inc()
        if error_type:
            self.errors.labels(model, error_type).inc()
        self.latency.labels(model).observe(seconds)
        if ACCESS_LOG.isEnabledFor(logging.INFO):
            ACCESS_LOG.info(json.dumps({"ts": round(time.time(), 3), "protocol": protocol,
                                        "model": model, "outcome": outcome,
                                        "error": error_type, "ms": round(seconds * 1e3, 3),
                                        "id": request_id}))


def log_to_stderr() -> None:
    """Access log lines (one JSON object each) on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    ACCESS_LOG.addHandler(handler)
    ACCESS_LOG.setLevel(logging.INFO)
    ACCESS_LOG.propagate = False
