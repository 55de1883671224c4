"""Prometheus endpoints (BYTEPS_METRICS_PORT): every process of a job can serve its
figures at http://<host>:<port>/metrics, in Prometheus's text format, with the
prometheus-client library (`pip install tf_bps[metrics]`). The servers serve theirs from
the native program (custom_ops/server/metrics_endpoint.h); the workers' come from the
core's counters (worker/stats.h, read at each scrape) and the scheduler's from its
membership (control/scheduler_metrics.py).

The endpoint answers one request at a time, each within REQUEST_DEADLINE_S however
slowly its bytes come: a stranger who reaches the port can delay a scrape, never hold a
thread or memory of the job's.
"""

from __future__ import annotations

import http.server
import logging
import socket
import socketserver
import threading
from collections.abc import Iterator

from tf_bps.runtime import core
from tf_bps.runtime.config import Config, ConfigError

log = logging.getLogger("tf_bps.metrics")

REQUEST_DEADLINE_S = 2.0


def _prometheus():
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError("BYTEPS_METRICS_PORT is set, and the Prometheus endpoint needs the "
                          "prometheus-client library: pip install tf_bps[metrics]") from None
    return prometheus_client


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET /metrics (or /): the registry's exposition; anything else: 404."""

    def setup(self) -> None:
        super().setup()
        self.request.settimeout(REQUEST_DEADLINE_S)
        # The socket's timeout bounds each read; this bounds the request as a whole.
        self._deadline = threading.Timer(REQUEST_DEADLINE_S, self._cut)
        self._deadline.start()

    def _cut(self) -> None:
        try:
            self.request.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def finish(self) -> None:
        self._deadline.cancel()
        try:
            super().finish()
        except OSError:
            pass  # The client went away, or the deadline cut it.

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?")[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is served here")
            return
        prometheus = _prometheus()
        body = prometheus.generate_latest(self.server.registry)
        self.send_response(200)
        self.send_header("Content-Type", prometheus.CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's name)
        log.debug("metrics request from %s: " + format, self.address_string(), *args)


class _Server(socketserver.TCPServer):
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        log.debug("metrics request from %s failed", client_address, exc_info=True)


def serve(config: Config, collector, who: str) -> int | None:
    """Starts this process's endpoint where BYTEPS_METRICS_PORT asks (0: any free port),
    with `collector` (a prometheus-client collector) beside the library's process
    figures, on a daemon thread; logs where. Returns the port, or None without the
    variable. A port that cannot be had is a ConfigError naming it."""
    if config.metrics_port is None:
        return None
    prometheus = _prometheus()
    registry = prometheus.CollectorRegistry()
    prometheus.ProcessCollector(registry=registry)
    registry.register(collector)
    host = metrics_host(config)
    try:
        server = _Server((host, config.metrics_port), _Handler)
    except OSError as error:
        raise ConfigError(f"BYTEPS_METRICS_PORT={config.metrics_port}: the {who}'s Prometheus "
                          f"endpoint cannot listen there ({error.strerror})") from None
    server.registry = registry
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    port = server.server_address[1]
    log.warning("%s metrics at http://%s:%d/metrics", who, host or socket.gethostname(), port)
    return port


def metrics_host(config: Config) -> str:
    """Where a process's endpoint listens: where its node listens in a distributed job
    (config.listen_host), everywhere in a job of one process."""
    try:
        return config.listen_host()
    except ConfigError:
        return ""


class WorkerCollector:
    """A worker's figures, read from the core at each scrape (worker/stats.h)."""

    def __init__(self, rank_and_size):
        self._rank_and_size = rank_and_size  # () -> (rank, size), which re-forms change
        self._sizes, self._latencies = core.worker_stats_bounds()

    def collect(self) -> Iterator:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            SummaryMetricFamily,
        )
        stats = core.worker_stats()
        rank, size = self._rank_and_size()
        yield GaugeMetricFamily("tf_bps_worker_rank", "This worker's rank in the job.", rank)
        yield GaugeMetricFamily("tf_bps_worker_size", "The job's number of workers.", size)
        steps = stats["steps"]
        yield CounterMetricFamily("tf_bps_worker_steps", "Steps finished: rounds of the first "
                                  "tensor this worker reduced.", steps)
        yield SummaryMetricFamily("tf_bps_worker_step_seconds", "Time between consecutive "
                                  "steps.", count_value=max(steps - 1, 0),
                                  sum_value=stats["step_seconds_sum"])
        yield GaugeMetricFamily("tf_bps_worker_last_step_seconds", "The last step's time.",
                                stats["last_step_seconds"])
        yield GaugeMetricFamily("tf_bps_worker_last_step_timestamp_seconds", "When the last "
                                "step finished (Unix time; 0: none yet).",
                                stats["last_step_time"])
        for name, key, text in (
                ("pushed_bytes", "pushed_bytes", "Bytes pushed to the servers, as sent."),
                ("pushed_uncompressed_bytes", "pushed_raw_bytes",
                 "Bytes pushed to the servers, before compression."),
                ("pulled_bytes", "pulled_bytes", "Bytes of the servers' answers."),
                ("failed_operations", "failed_operations", "Operations that failed.")):
            yield CounterMetricFamily(f"tf_bps_worker_{name}", text, stats[key])
        yield GaugeMetricFamily(
            "tf_bps_worker_compression_ratio", "Bytes before compression per byte pushed (1: "
            "none).", stats["pushed_raw_bytes"] / stats["pushed_bytes"]
            if stats["pushed_bytes"] else 1.0)
        latency = HistogramMetricFamily("tf_bps_worker_push_pull_seconds", "push_pull time, "
                                        "from its call to its result, by input size.",
                                        labels=["size"])
        for index, counts in enumerate(stats["push_pull_counts"]):
            latency.add_metric([self._size_label(index)], self._buckets(counts),
                               stats["push_pull_seconds"][index])
        yield latency

    def _size_label(self, index: int) -> str:
        """The size class's upper bound ("4KiB", ...), or "more" past the last."""
        if index == len(self._sizes):
            return "more"
        size, unit = self._sizes[index], "B"
        for name in ("KiB", "MiB", "GiB"):
            if size % 1024:
                break
            size, unit = size // 1024, name
        return f"{size}{unit}"

    def _buckets(self, counts: list[int]) -> list[tuple[str, int]]:
        cumulative, buckets = 0, []
        for bound, count in zip([*map(str, self._latencies), "+Inf"], counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        return buckets
