"""The scheduler's Prometheus figures (BYTEPS_METRICS_PORT, runtime/metrics.py): who is
in the job, its generation and re-forms, and what it turned away at its port."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class Membership:
    """What the scheduler's loop tells the endpoint's thread, replaced whole on each
    change (never mutated), so that a scrape reads one consistent generation."""

    workers: int = 0
    servers: int = 0
    generation: int = 0
    reforms: int = 0
    forming: bool = True  # a generation is registering


@dataclass(eq=False)  # registries key their collectors by identity
class SchedulerCollector:
    membership: Callable[[], Membership]
    turned_away: Callable[[], dict[str, int]]
    _whys: tuple[str, ...] = field(
        default=("malformed", "refused", "replayed", "unopened", "flood"))

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        now = self.membership()
        for name, value, text in (
                ("workers", now.workers, "Workers of the job's generation."),
                ("servers", now.servers, "Servers of the job's generation."),
                ("generation", now.generation, "The job's generation (0 until it re-forms)."),
                ("forming", int(now.forming), "1 while a generation registers.")):
            yield GaugeMetricFamily(f"tf_bps_scheduler_{name}", text, value)
        yield CounterMetricFamily("tf_bps_scheduler_reforms", "Times the job re-formed.",
                                  now.reforms)
        turned_away = CounterMetricFamily(
            "tf_bps_scheduler_turned_away", "Messages turned away at the scheduler's port, "
            "by why: malformed, refused (no proof of the job's token, or no place in the "
            "job), replayed, unopened (not sealed by a member), flood (past a stranger's "
            "budget).", labels=["why"])
        counts = dict(self.turned_away())
        for why in sorted({*self._whys, *counts}):
            turned_away.add_metric([why], counts.get(why, 0))
        yield turned_away
