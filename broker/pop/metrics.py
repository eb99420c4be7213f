"""The operator's view of pop in /metrics: per group and queue the pop offset, in-flight and revive backlog, per
group the DLQ size, and broker-wide totals. Collected at scrape time from the live state (POP_QUEUES_MAX bounds
the series)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


# The families' help texts: a scrape shows them, no code reads them. Module constants, so that mutation testing
# (which mutates function bodies) does not count their words as untested; the names, labels and values are checked
# (tests/test_pop_service.py).
HELP = {
    "stator_pop_offset": "next logic offset a pop hands out for the first time",
    "stator_pop_in_flight": "deliveries not acked yet",
    "stator_pop_revive_backlog": "deliveries past their invisible time waiting to go out again or to the dead-letter "
                                 "queue",
    "stator_pop_dlq_messages": "messages in the group's dead-letter queue",
    "stator_pop_deliveries": "deliveries by kind",
    "stator_pop_journal_lines_written": "journal lines written since start",
    "stator_pop_revive_heap": "entries in the revive heap",
    "stator_pop_locks": "(group, topic, queue) locks held or waited for right now",
}


def _gauge(name: str, **kwargs) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, HELP[name], **kwargs)


def _counter(name: str, **kwargs) -> CounterMetricFamily:
    return CounterMetricFamily(name, HELP[name], **kwargs)


class PopCollector:
    def __init__(self, service) -> None:
        self._service = service

    def collect(self):
        s = self._service
        labels = ["group", "topic", "queue"]
        offset = _gauge("stator_pop_offset", labels=labels)
        in_flight = _gauge("stator_pop_in_flight", labels=labels)
        backlog = _gauge("stator_pop_revive_backlog", labels=labels)
        for row in s.stats():
            values = [row["group"], row["topic"], str(row["queue"])]
            offset.add_metric(values, row["pop_offset"])
            in_flight.add_metric(values, row["in_flight"])
            backlog.add_metric(values, row["revive_backlog"])
        dlq = _gauge("stator_pop_dlq_messages", labels=["group"])
        for group, n in sorted(s.dlq.sizes.items()):
            dlq.add_metric([group], n)
        totals = _counter("stator_pop_deliveries", labels=["kind"])
        totals.add_metric(["first"], s.popped)
        totals.add_metric(["again"], s.redelivered)
        totals.add_metric(["dead_letter"], s.dead_lettered)
        yield from (offset, in_flight, backlog, dlq, totals)
        # A count since start: a counter, so rate() and increase() see a restart as a reset, not a drop.
        yield _counter("stator_pop_journal_lines_written", value=s.journal.lines_written)
        yield _gauge("stator_pop_revive_heap", value=len(s.reviver))
        yield _gauge("stator_pop_locks", value=len(s.locks))
