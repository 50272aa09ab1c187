"""Server metrics in the Prometheus text exposition format (no client library needed)."""

from __future__ import annotations

from collections import defaultdict

from asyncsandbox import LimiterStatistics, SessionStatistics

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PREFIX = "asyncsandbox_remote_"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: object) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
    return "{" + inner + "}"


class _Histogram:
    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * len(BUCKETS)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, bound in enumerate(BUCKETS):
            if value <= bound:
                self.buckets[i] += 1


class Metrics:
    """Counters the server updates as it works, rendered on ``GET /metrics``."""

    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, str, int], int] = defaultdict(int)
        self.latency: defaultdict[str, _Histogram] = defaultdict(_Histogram)
        self.quota_rejections: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.auth_failures = 0
        self.leases_expired = 0
        self.idempotent_replays = 0
        self.disconnect_kills = 0

    def observe(self, operation: str, method: str, status: int, seconds: float) -> None:
        self.requests[(operation, method, status)] += 1
        self.latency[operation].observe(seconds)

    def render(
        self,
        *,
        tenants: dict[str, tuple[int, int, int]],
        statistics: SessionStatistics | None,
    ) -> str:
        """The exposition text. ``tenants`` maps a name to (live, creating, in flight)."""
        out: list[str] = []

        def family(name: str, kind: str, help_: str) -> None:
            out.append(f"# HELP {PREFIX}{name} {help_}")
            out.append(f"# TYPE {PREFIX}{name} {kind}")

        def sample(name: str, value: float, **labels: object) -> None:
            out.append(f"{PREFIX}{name}{_labels(**labels)} {value:g}")

        family("requests_total", "counter", "HTTP requests answered, by operation and status.")
        for (operation, method, status), count in sorted(self.requests.items()):
            sample("requests_total", count, operation=operation, method=method, status=status)
        family(
            "request_duration_seconds",
            "histogram",
            "Time to answer (streams: to the first byte), by operation.",
        )
        for operation, hist in sorted(self.latency.items()):
            for bound, count in zip(BUCKETS, hist.buckets, strict=True):
                sample("request_duration_seconds_bucket", count, operation=operation, le=bound)
            sample("request_duration_seconds_bucket", hist.count, operation=operation, le="+Inf")
            sample("request_duration_seconds_sum", hist.sum, operation=operation)
            sample("request_duration_seconds_count", hist.count, operation=operation)
        family("sandboxes", "gauge", "Live sandboxes, by tenant.")
        for name, (live, _, _) in tenants.items():
            sample("sandboxes", live, tenant=name)
        family("sandboxes_creating", "gauge", "Sandboxes being created, by tenant.")
        for name, (_, creating, _) in tenants.items():
            sample("sandboxes_creating", creating, tenant=name)
        family("operations_in_flight", "gauge", "Commands and file transfers running, by tenant.")
        for name, (_, _, in_flight) in tenants.items():
            sample("operations_in_flight", in_flight, tenant=name)
        family("quota_rejections_total", "counter", "Requests refused by a tenant quota (429).")
        for (tenant, quota), count in sorted(self.quota_rejections.items()):
            sample("quota_rejections_total", count, tenant=tenant, quota=quota)
        for name, value, help_ in (
            ("auth_failures_total", self.auth_failures, "Requests with no or an unknown key."),
            ("leases_expired_total", self.leases_expired, "Sandboxes reaped: lease expired."),
            ("idempotent_replays_total", self.idempotent_replays, "Creates answered by key."),
            ("disconnect_kills_total", self.disconnect_kills, "Commands killed: client left."),
        ):
            family(name, "counter", help_)
            sample(name, value)
        if statistics is not None:
            for name, value, help_ in (
                ("session_sandboxes_started_total", statistics.sandboxes_started, "Started."),
                ("session_sandboxes_removed_total", statistics.sandboxes_removed, "Removed."),
                ("session_start_failures_total", statistics.start_failures, "Failed starts."),
                ("session_remove_failures_total", statistics.remove_failures, "Failed removals."),
                ("session_execs_finished_total", statistics.execs_finished, "Commands ended."),
                ("session_execs_timed_out_total", statistics.execs_timed_out, "Timed out."),
                ("session_execs_failed_total", statistics.execs_failed, "Infrastructure errors."),
                ("session_pool_hits_total", statistics.pool_hits, "Starts given a ready one."),
            ):
                family(name, "counter", help_)
                sample(name, value)
            limiters: list[LimiterStatistics] = [
                statistics.live,
                statistics.lifecycle,
                statistics.execs,
            ]
            family("session_pool_ready", "gauge", "Sandboxes reset and ready for a start.")
            sample("session_pool_ready", statistics.pool_ready)
            family("session_slots_active", "gauge", "Slots held in the server's Session limits.")
            for lim in limiters:
                sample("session_slots_active", lim.active, limiter=lim.name)
            family("session_slots_waiting", "gauge", "Tasks queued for a Session slot.")
            for lim in limiters:
                sample("session_slots_waiting", lim.waiting, limiter=lim.name)
        return "\n".join(out) + "\n"
