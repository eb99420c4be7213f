"""AdminClient against the fake meta (whose history paging tests/test_client_contract.py holds to the real one):
paging through topic-filtered history that a single call cannot scan in one go."""

from __future__ import annotations

from client import AdminClient
from tests.support.client_fakes import TOKEN, Fakes, make_route

SCAN_EVENTS = 5           # the fake's stand-in for meta/limits.py HISTORY_SCAN_EVENTS_MAX (50,000)
UNRELATED_BETWEEN = 12    # more unrelated events between two matches than one call scans


async def test_iter_history_goes_on_past_filtered_pages_that_found_nothing():
    async with Fakes() as f:
        f.meta.history_scan_events_max = SCAN_EVENTS
        wanted = []
        for _ in range(4):
            for _ in range(UNRELATED_BETWEEN):
                f.meta.record("BrokerRegistered", None, {"broker": "b9"})
            wanted.append(f.meta.set_route(make_route("a", [("b1", f.b1.url)])))
        f.meta.record("BrokerRegistered", None, {"broker": "b9"})
        async with AdminClient([f.meta.url], TOKEN) as admin:
            first = await admin.history(topic="a", after=0)
            # The case to keep going on: nothing matched within the scan, yet the scan moved on.
            assert first["events"] == [] and first["next_after"] == f.meta.events[SCAN_EVENTS - 1]["version"]
            assert [e["version"] async for e in admin.iter_history(topic="a", page=2)] == wanted
            assert len([e async for e in admin.iter_history(page=7)]) == len(f.meta.events)
            assert [e async for e in admin.iter_history(topic="nothing")] == []
