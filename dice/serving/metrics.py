"""The server's Prometheus metrics (``prometheus-client``), one registry per app so that tests can run
several servers in one process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes, CPU seconds, open fds
        self.requests = Counter("dice_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.latency = Histogram(
            "dice_request_seconds",
            "time from a request's arrival to its last byte",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.first_token = Histogram(
            "dice_time_to_first_token_seconds",
            "time from a generation request's arrival to its first text",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "dice_queue_wait_seconds",
            "time a request waited for its batch to start",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram(
            "dice_batch_rows", "rows decoded together per batch", buckets=BATCH_BUCKETS, registry=r
        )
        self.prompt_tokens = Counter("dice_prompt_tokens", "prompt tokens received", registry=r)
        self.generated_tokens = Counter("dice_generated_tokens", "tokens generated", registry=r)
        self.steps = Counter("dice_denoising_steps", "denoising forwards run", registry=r)
        self.cancelled = Counter("dice_cancelled_requests", "requests whose client went away", registry=r)
        self.queued = Gauge("dice_queued_requests", "requests waiting for a batch", registry=r)
        self.running = Gauge("dice_running_requests", "requests being decoded", registry=r)

    def observe(self, what: str, value: float) -> None:
        """The batcher's reports (``Batcher(observe=...)``)."""
        if what == "batch":
            self.batch_rows.observe(value)
        elif what == "steps":
            self.steps.inc(value)
        elif what == "tokens":
            self.generated_tokens.inc(value)
        elif what == "queue_wait":
            self.queue_wait.observe(value)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
