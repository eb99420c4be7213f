"""broker/rates.py: the last hour per topic in wall-clock minutes, the running minute last; old minutes fall out;
the topics kept are bounded. (The console's topic page sums them over real brokers: tests/test_console.py.)"""

from __future__ import annotations

from broker import rates


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_counts_land_in_their_minute_and_an_hour_later_are_gone():
    clock = Clock(1_795_000_000.0)   # 08:26:40 UTC of some day: 40 s into its minute
    m = rates.MinuteCounts(clock)
    m.add("t", rates.STORED, 5)
    m.add("t", rates.SERVED, 2)
    clock.t += 30                    # the next minute
    m.add("t", rates.STORED, 7)
    h = m.last_hour("t")
    assert h["minute_ms"] == int(clock.t // 60) * 60_000
    assert len(h["stored"]) == len(h["served"]) == rates.MINUTES
    assert h["stored"][-2:] == [5, 7] and h["served"][-2:] == [2, 0] and sum(h["stored"]) == 12
    clock.t += 60 * (rates.MINUTES - 1)   # the first minute is just out of the hour, the second still in
    h = m.last_hour("t")
    assert sum(h["stored"]) == 7 and h["stored"][0] == 7
    m.add("t", rates.STORED, 1)      # reuses the slot of a minute an hour old: it starts from nothing
    assert m.last_hour("t")["stored"][-1] == 1 and sum(m.last_hour("t")["stored"]) == 8


def test_an_unknown_topic_is_an_hour_of_nothing_and_topics_are_bounded():
    m = rates.MinuteCounts(Clock(1_795_000_000.0))
    assert m.last_hour("never")["stored"] == [0] * rates.MINUTES
    for i in range(rates.TOPICS_MAX):
        m.add(f"t{i}", rates.STORED, 1)
    m.add("one-too-many", rates.STORED, 1)
    assert sum(m.last_hour("one-too-many")["stored"]) == 0 and sum(m.last_hour("t0")["stored"]) == 1
