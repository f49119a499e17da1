"""Prometheus metrics of the front door (GET /metrics).

Counts what clients see: requests, prompt / cached / completion tokens (and the policy version that
sampled each), TTFT and inter-token latency, per-worker load and cache hits (the worker that served
each request is reported by Dynamo's router), how long weight updates paused workers, and what became of
each trace record: a trace the store could not write (disk full) is counted here, never lost silently;
and the Batch API files the retention sweep removed.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine.client.embedded_router import ROUTER_METRICS
from engine.contract import POLICY_LAG
from rollout_server.serving.finished import FinishedGeneration

# The trace capture's counters (TraceCapture.stats) shown as rollout_trace_records{outcome=...}, since start.
TRACE_OUTCOMES = ("written", "fields_dropped", "write_errors", "unstorable", "expired")
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("rollout_requests", "Requests by endpoint and outcome", ["endpoint", "outcome"], registry=r)
        self.in_flight = Gauge("rollout_requests_in_flight", "Requests being served", ["endpoint"], registry=r)
        self.prompt_tokens = Counter("rollout_prompt_tokens", "Prompt tokens served", registry=r)
        self.cached_tokens = Counter("rollout_cached_prompt_tokens", "Prompt tokens served from the KV cache", registry=r)
        self.completion_tokens = Counter("rollout_completion_tokens", "Completion tokens generated", registry=r)
        self.ttft = Histogram("rollout_time_to_first_token_seconds", "Time to first token", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("rollout_inter_token_latency_seconds", "Time between streamed tokens", buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("rollout_request_seconds", "End-to-end request time", buckets=_LATENCY_BUCKETS, registry=r)
        self.worker_requests = Counter("rollout_worker_requests", "Requests served per worker", ["worker"], registry=r)
        self.worker_prompt_tokens = Counter("rollout_worker_prompt_tokens", "Prompt tokens per worker", ["worker"], registry=r)
        self.worker_cached_tokens = Counter("rollout_worker_cached_prompt_tokens", "Cached prompt tokens per worker", ["worker"], registry=r)
        self.worker_inflight = Gauge("rollout_worker_inflight_requests", "In-flight requests per worker (Dynamo's count)",
                                     ["worker", "instance_id"], registry=r)
        self.worker_healthy = Gauge("rollout_worker_healthy", "1 if the worker answers its health check", ["worker"], registry=r)
        self.pool_workers = Gauge("rollout_pool_workers", "Workers per pool (started, ready)", ["pool", "state"], registry=r)
        self.pool_in_flight = Gauge("rollout_pool_requests_in_flight", "Requests in flight per pool", ["pool"], registry=r)
        self.pool_failovers = Gauge("rollout_pool_failovers", "Requests moved to another deployment after a "
                                    "refusal before output, since start", ["pool"], registry=r)
        self.pool_cold_starts = Gauge("rollout_pool_cold_starts", "Scale-ups from zero workers, since start",
                                      ["pool"], registry=r)
        self.session_prompt_tokens_reused = Gauge(
            "rollout_session_prompt_tokens_reused", "Prompt tokens of returning session turns not tokenized again "
            "(their ids kept from the turn before), since start", registry=r)
        self.completion_tokens_by_version = Counter(
            "rollout_completion_tokens_by_policy_version", "Completion tokens, by the policy version that sampled "
            "them", ["version"], registry=r)
        self.stale_requests = Counter("rollout_requests_ended_for_staleness", "Choices ended by their "
                                      "max_policy_lag (finish reason policy_lag)", registry=r)
        self.update_pause = Histogram("rollout_weight_update_pause_seconds", "How long a worker was paused for a "
                                      "weight update or an admin pause", buckets=_LATENCY_BUCKETS, registry=r)
        self.trace_records = Gauge(
            "rollout_trace_records", "Trace records since start, by outcome: written (durable in the WAL); "
            "fields_dropped (written without fields that could not be redacted or encoded); lost: write_errors "
            "(the write failed: disk full, an unwritable store), unstorable (not encodable even without those "
            "fields); expired (removed by retention)", ["outcome"], registry=r)
        self.batch_files_expired = Gauge("rollout_batch_files_expired", "Batch API files (inputs, outputs, "
                                         "errors) removed by retention, since start", registry=r)
        self.deployment_healthy = Gauge("rollout_deployment_healthy", "1 if the deployment (Dynamo frontend + "
                                        "workers) is in rotation", ["pool", "deployment"], registry=r)

    def watch_traces(self, stats: Callable[[], dict]) -> None:
        """Reads the trace capture's counters (`TraceCapture.stats`) at every scrape."""
        for outcome in TRACE_OUTCOMES:
            self.trace_records.labels(outcome).set_function(lambda outcome=outcome: stats()[outcome])

    def watch_batches(self, files_expired: Callable[[], int]) -> None:
        """Reads the batch runner's count of expired files (`BatchRunner.files_expired`) at every scrape."""
        self.batch_files_expired.set_function(files_expired)

    def request_started(self, endpoint: str) -> None:
        self.in_flight.labels(endpoint).inc()

    def request_finished(self, endpoint: str, ok: bool) -> None:
        self.in_flight.labels(endpoint).dec()
        self.requests.labels(endpoint, "ok" if ok else "error").inc()

    def request_rejected(self, endpoint: str) -> None:
        self.requests.labels(endpoint, "rejected").inc()

    def observe_generation(self, g: FinishedGeneration) -> None:
        self.prompt_tokens.inc(g.prompt_tokens)
        self.cached_tokens.inc(g.cached_tokens)
        self.completion_tokens.inc(g.completion_tokens)
        for choice in g.choices:
            for version, count in Tally(t.policy_version for t in choice.tokens).items():
                self.completion_tokens_by_version.labels(str(version)).inc(count)
            if choice.finish_reason == POLICY_LAG:
                self.stale_requests.inc()
        if g.ttft_s is not None:
            self.ttft.observe(g.ttft_s)
        observe_all(self.itl, g.inter_token_s)
        self.e2e.observe(g.total_s)
        if g.worker_id is not None:
            self.worker_requests.labels(g.worker_id).inc()
            self.worker_prompt_tokens.labels(g.worker_id).inc(g.prompt_tokens)
            self.worker_cached_tokens.labels(g.worker_id).inc(g.cached_tokens)

    def update_workers(self, rows: list[dict]) -> None:
        for row in rows:
            worker = str(row["worker"])
            self.worker_healthy.labels(worker).set(1.0 if row["healthy"] else 0.0)
            if row.get("inflight_requests") is not None:  # a worker of another host: its load is read there
                self.worker_inflight.labels(worker, row.get("instance_id") or "").set(row["inflight_requests"])

    def update_pools(self, pools: list[dict]) -> None:
        for pool in pools:
            name = pool["name"]
            self.pool_workers.labels(name, "started").set(pool["workers"])
            self.pool_workers.labels(name, "ready").set(pool["ready_workers"])
            self.pool_in_flight.labels(name).set(pool["in_flight"])
            self.pool_failovers.labels(name).set(pool["failovers"])
            self.pool_cold_starts.labels(name).set(pool["cold_starts"])
            for deployment in pool["deployments"]:
                self.deployment_healthy.labels(name, deployment["name"]).set(1.0 if deployment["healthy"] else 0.0)

    def requests_in_flight(self) -> float:
        return sum(gauge._value.get() for gauge in self.in_flight._metrics.values())

    def cache_hit_rate(self) -> float:
        prompt = self.prompt_tokens._value.get()
        return self.cached_tokens._value.get() / prompt if prompt else 0.0

    def render(self) -> bytes:
        return generate_latest(self.registry) + generate_latest(ROUTER_METRICS)  # + the router call's cost


def observe_all(histogram: Histogram, values: list[float]) -> None:
    """`histogram.observe(v)` for every value, with each bucket's count and the sum added to once: observe()
    takes a lock per value, and a request has a value for every token (its inter-token gaps)."""
    for bucket, count in Tally(bisect_left(histogram._upper_bounds, v) for v in values).items():
        histogram._buckets[bucket].inc(count)  # the first bucket whose upper bound is >= v, as observe() picks
    histogram._sum.inc(sum(values))
