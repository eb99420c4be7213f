"""The operator's view of pop in /metrics: per group and queue the pop offset, in-flight and revive backlog, per
group the DLQ size, and broker-wide totals. Collected at scrape time from the live state (POP_QUEUES_MAX bounds
the series)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


# Harmless mutants: the help texts of the families (their words, their case, None): a scrape shows them, no code
# reads them. The names, labels and values are checked (tests/test_pop_service.py).
class PopCollector:
    def __init__(self, service) -> None:
        self._service = service

    def collect(self):
        s = self._service
        labels = ["group", "topic", "queue"]
        offset = GaugeMetricFamily("stator_pop_offset", "next logic offset a pop hands out for the first time",
                                   labels=labels)
        in_flight = GaugeMetricFamily("stator_pop_in_flight", "deliveries not acked yet", labels=labels)
        backlog = GaugeMetricFamily("stator_pop_revive_backlog", "deliveries past their invisible time waiting to "
                                    "go out again or to the dead-letter queue", labels=labels)
        for row in s.stats():
            values = [row["group"], row["topic"], str(row["queue"])]
            offset.add_metric(values, row["pop_offset"])
            in_flight.add_metric(values, row["in_flight"])
            backlog.add_metric(values, row["revive_backlog"])
        dlq = GaugeMetricFamily("stator_pop_dlq_messages", "messages in the group's dead-letter queue",
                                labels=["group"])
        for group, n in sorted(s.dlq.sizes.items()):
            dlq.add_metric([group], n)
        totals = CounterMetricFamily("stator_pop_deliveries", "deliveries by kind", labels=["kind"])
        totals.add_metric(["first"], s.popped)
        totals.add_metric(["again"], s.redelivered)
        totals.add_metric(["dead_letter"], s.dead_lettered)
        yield from (offset, in_flight, backlog, dlq, totals)
        # A count since start: a counter, so rate() and increase() see a restart as a reset, not a drop.
        yield CounterMetricFamily("stator_pop_journal_lines_written", "journal lines written since start",
                                  value=s.journal.lines_written)
        yield GaugeMetricFamily("stator_pop_revive_heap", "entries in the revive heap", value=len(s.reviver))
        yield GaugeMetricFamily("stator_pop_locks", "(group, topic, queue) locks held or waited for right now",
                                value=len(s.locks))
