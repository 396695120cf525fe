"""Prometheus metrics of one service instance, in its own registry (no global state).

Labels are bounded sets (outcome, status, transport, and the configured rooms):
never a user or message id, nor a room chatbridge is not configured for, so
cardinality cannot grow with traffic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from bridge.core.transport import Transport

RUN_DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600)


class _ReconnectCollector(Collector):
    def __init__(self, transports: Sequence[Transport]) -> None:
        self._transports = transports

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "chatbridge_transport_reconnects",
            "Reconnections of each transport to its chat server",
            labels=["transport"],
        )
        for transport in self._transports:
            family.add_metric([transport.name], transport.reconnects)
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.messages = Counter(
            "chatbridge_messages",
            "Inbound messages by outcome (accepted, ignored, duplicate, command, edited, deleted)",
            ["outcome"],
            registry=r,
        )
        self.files = Counter(
            "chatbridge_files",
            "Files shared with messages, by what became of them when their run was prepared"
            " (fetched, too_large, failed)",
            ["outcome"],
            registry=r,
        )
        self.coalesced = Counter(
            "chatbridge_messages_coalesced",
            "Messages that went into a run together with at least one other message",
            registry=r,
        )
        self.runs_started = Counter("chatbridge_runs_started", "Runs started", registry=r)
        self.runs_finished = Counter(
            "chatbridge_runs_finished", "Runs finished by outcome", ["status"], registry=r
        )
        self.run_duration = Histogram(
            "chatbridge_run_duration_seconds",
            "Duration of finished runs",
            buckets=RUN_DURATION_BUCKETS,
            registry=r,
        )
        self.cost = Counter(
            "chatbridge_claude_cost_usd", "Total cost reported by claude, in USD", registry=r
        )
        self.room_cost = Counter(
            "chatbridge_room_cost_usd",
            "Cost claude reported per configured room, in USD",
            ["transport", "room"],
            registry=r,
        )
        self.budget_refusals = Counter(
            "chatbridge_budget_refusals",
            "Runs not started because a daily budget was spent, by budget (room, service)",
            ["budget"],
            registry=r,
        )
        self.usage_limits = Counter(
            "chatbridge_usage_limits",
            "Runs cut short by a usage or rate limit, and their retries after the reset"
            " (by outcome: limited, resumed)",
            ["outcome"],
            registry=r,
        )
        self.deliveries = Counter(
            "chatbridge_deliveries",
            "Outbox delivery attempts by outcome (delivered, failed, rate_limited, retried)",
            ["outcome"],
            registry=r,
        )
        self.prestarts = Counter(
            "chatbridge_prestarts",
            "Prestarted claudes by outcome (used, wasted) and why one was wasted"
            " (dropped, shutdown, slot needed, idle, adopted, changed, failed; kept warm after"
            " a run: expired, evicted, released)",
            ["outcome", "why"],
            registry=r,
        )
        self.prestart_saved = Counter(
            "chatbridge_prestart_saved_seconds",
            "Start-up time of claude that prestarts took off runs' paths",
            registry=r,
        )
        self.answers_refused = Counter(
            "chatbridge_approval_answers_refused",
            "Answers to tool requests (and !model, !mode) refused, by reason"
            " (not_approver, own_run, stranger)",
            ["reason"],
            registry=r,
        )
        self.schedule_firings = Counter(
            "chatbridge_schedule_firings",
            "Firings of [[schedules]] by outcome (fired, duplicate, skipped, missed)",
            ["outcome"],
            registry=r,
        )
        self.webhook_deliveries = Counter(
            "chatbridge_webhook_deliveries",
            "Requests to [[webhooks]] by outcome (accepted, duplicate, bad_signature,"
            " too_large, bad_request, failed)",
            ["outcome"],
            registry=r,
        )
        self.files_sent = Counter(
            "chatbridge_files_sent",
            "Files claude posted with send_file, by outcome (queued, refused by the bridge)",
            ["outcome"],
            registry=r,
        )
        self.active_runs = Gauge("chatbridge_active_runs", "Runs active now", registry=r)
        # Replicas (docs/replicas.md): this replica's view of the cluster.
        self.owned_conversations = Gauge(
            "chatbridge_cluster_owned_conversations",
            "Conversations whose lease this replica holds",
            registry=r,
        )
        self.lease_moves = Counter(
            "chatbridge_cluster_conversations_taken",
            "Conversations this replica took: new ones, or failovers from another replica",
            ["how"],
            registry=r,
        )
        self.leases_lost = Counter(
            "chatbridge_cluster_conversations_lost",
            "Conversations this replica lost (its lease was taken or ran out)",
            registry=r,
        )
        self.journal_unwritable = Counter(
            "chatbridge_journal_unwritable",
            "Runs whose journal could not be written (state_dir's disk full): their"
            " supervisor held claude's output in memory until it could",
            registry=r,
        )
        self.forwarded = Counter(
            "chatbridge_cluster_forwarded",
            "Messages, approval actions and console decisions handed to the replica owning"
            " their conversation",
            ["kind"],
            registry=r,
        )
        self.unowned_lag = Gauge(
            "chatbridge_cluster_unowned_work_age_seconds",
            "Age of the oldest work (message, answer, run) no live replica owned at the last poll",
            registry=r,
        )
        self.queued = Gauge(
            "chatbridge_queued_messages", "Accepted messages not yet in a run", registry=r
        )

    def watch(
        self,
        active_runs: Callable[[], float],
        queued: Callable[[], float],
        transports: Sequence[Transport],
    ) -> None:
        """Read live values at scrape time."""
        self.active_runs.set_function(active_runs)
        self.queued.set_function(queued)
        self.registry.register(_ReconnectCollector(transports))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
