"""The server's Prometheus metrics (``GET /metrics``): requests, tokens, queue depth, busy slots, prefill and decode
speed, time to first token, KV cache use, the prefix cache and resumable streams. Each app has its own registry, so
two servers in one process (tests) do not share counters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]


class _Cached:
    """The prefix cache's and the resumable streams' figures, read when scraped."""

    def __init__(self, prefix_cache: Any, streams: Any) -> None:
        self.prefix_cache, self.streams = prefix_cache, streams

    def collect(self) -> Iterator[Any]:
        if self.prefix_cache is not None:
            s, c = self.prefix_cache.stats, self.prefix_cache
            yield CounterMetricFamily("hetero_prefix_cache_hits", "Prompts that restored a cached prefix", s.hits)
            yield CounterMetricFamily("hetero_prefix_cache_misses", "Prompts that found no longer cached prefix "
                                      "than their slot held", s.misses)
            yield CounterMetricFamily("hetero_prefix_cache_tokens_saved", "Prompt tokens restored from the prefix "
                                      "cache instead of computed", s.tokens_saved)
            yield CounterMetricFamily("hetero_prefix_cache_evictions", "Snapshots dropped for room", s.evicted)
            yield GaugeMetricFamily("hetero_prefix_cache_entries", "Prompts kept in the prefix cache", len(c))
            yield GaugeMetricFamily("hetero_prefix_cache_bytes", "Bytes of the prefix cache's snapshots", c.nbytes)
            if c.directory is not None:  # --prefix-cache-dir
                yield CounterMetricFamily("hetero_prefix_cache_file_hits", "Prompts that restored a prefix from a "
                                          "prefix-cache file (counted in the hits too)", s.file_hits)
                yield CounterMetricFamily("hetero_prefix_cache_files_written", "Prefix-cache files written",
                                          s.files_written)
        if self.streams is not None:
            yield GaugeMetricFamily("hetero_streams_resumable", "Streams kept for resuming", len(self.streams))
            yield CounterMetricFamily("hetero_streams_resumed", "Reconnections to a stream", self.streams.resumed)


class _Batched:
    """The batcher's counts (``hetero.llm.batch.BatchStats``) of a model serving several sequences: what its steps
    carried and the time in and around the session's runs."""

    def __init__(self, batcher: Any) -> None:
        self.batcher = batcher

    def collect(self) -> Iterator[Any]:
        s = self.batcher.stats
        yield CounterMetricFamily("hetero_batch_steps", "Batched steps run (session runs)", s.steps)
        yield CounterMetricFamily("hetero_batch_rows", "Rows (tokens) the batched steps carried", s.rows)
        yield CounterMetricFamily("hetero_batch_decode_rows", "One-token (decode) rows of the batched steps",
                                  s.decode_rows)
        yield CounterMetricFamily("hetero_batch_prompt_rows", "Prompt rows of the batched steps", s.prompt_rows)
        yield CounterMetricFamily("hetero_batch_fused_steps", "Steps that carried prompt and decode rows", s.fused)
        yield CounterMetricFamily("hetero_batch_isolated_steps", "Failed steps run again one sequence at a time",
                                  s.isolated)
        yield CounterMetricFamily("hetero_batch_run_seconds", "Time in the session's runs of the batched steps",
                                  s.run_seconds)
        yield CounterMetricFamily("hetero_batch_step_seconds", "Time from taking a batch to handing out its results",
                                  s.step_seconds)


class Metrics:
    def __init__(self, scheduler: Any, prefix_cache: Any = None, streams: Any = None) -> None:
        r = self.registry = CollectorRegistry()
        r.register(_Cached(prefix_cache, streams))
        batcher = getattr(scheduler.models[0], "_batch", None)
        if batcher is not None and all(getattr(m, "_batch", None) is batcher for m in scheduler.models):
            r.register(_Batched(batcher))
        self.requests = Counter("hetero_requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("hetero_prompt_tokens", "Prompt tokens received", registry=r)
        self.cached_tokens = Counter("hetero_prompt_cached_tokens",
                                     "Prompt tokens whose K/V were reused from a slot's cache", registry=r)
        self.generated_tokens = Counter("hetero_generated_tokens", "Tokens generated", registry=r)
        self.prefill_seconds = Counter("hetero_prefill_seconds", "Time spent on prompts (to the first token)",
                                       registry=r)
        self.decode_seconds = Counter("hetero_decode_seconds", "Time spent generating after the first token",
                                      registry=r)
        self.prefill_speed = Gauge("hetero_prefill_tokens_per_second", "Prompt tokens computed per second, "
                                   "last request", registry=r)
        self.decode_speed = Gauge("hetero_decode_tokens_per_second", "Tokens generated per second, last request",
                                  registry=r)
        self.first_token = Histogram("hetero_time_to_first_token_seconds", "From a slot taking the request to its "
                                     "first token", registry=r,
                                     buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        Gauge("hetero_queue_depth", "Requests waiting for a slot", registry=r).set_function(
            lambda: scheduler.waiting)
        Gauge("hetero_slots_busy", "Slots running a request", registry=r).set_function(lambda: scheduler.busy)
        Gauge("hetero_slots", "Slots (models loaded)", registry=r).set(len(scheduler.models))
        Gauge("hetero_kv_cache_tokens", "Tokens held in the slots' KV caches", registry=r).set_function(
            scheduler.cache_tokens)
        capacity = sum(m.context for m in scheduler.models)
        Gauge("hetero_kv_cache_usage_ratio", "Share of the slots' KV cache positions in use", registry=r
              ).set_function(lambda: scheduler.cache_tokens() / capacity)

    def count(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def generation(self, timings: dict[str, Any]) -> None:
        """A finished (or cancelled) generation's figures (``Usage.timings()``)."""
        prompt, cached, generated = timings["prompt_n"], timings["prompt_cached"], timings["predicted_n"]
        prefill, decode = timings["prompt_ms"] / 1e3, timings["predicted_ms"] / 1e3
        self.prompt_tokens.inc(prompt)
        self.cached_tokens.inc(cached)
        self.generated_tokens.inc(generated)
        self.prefill_seconds.inc(prefill)
        self.decode_seconds.inc(decode)
        self.first_token.observe(prefill)
        if prefill > 0:
            self.prefill_speed.set((prompt - cached) / prefill)
        if decode > 0 and generated > 1:
            self.decode_speed.set((generated - 1) / decode)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
