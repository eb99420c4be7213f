"""Consumer-group members against a real meta cluster: heartbeats, the queues an answer grants, short leases.
"""

from __future__ import annotations

from tests.support.meta_http import ok


LEASE_MS = 2000
HEARTBEAT_MS = 500


async def beat(c, member: str, topics=("t",), group: str = "g", mode: str = "exclusive", released=None,
               url: str | None = None) -> dict:
    body = {"member": member, "topics": list(topics), "mode": mode}
    if released:
        body["released"] = released
    return await ok(c, "POST", f"/v1/groups/{group}/heartbeat", "client", body, url=url)


def held(answer: dict) -> dict[int, int]:
    return {a["queue"]: a["token"] for a in answer["assignments"]}


async def short_leases(c, group: str = "g") -> None:
    await ok(c, "PUT", f"/v1/groups/{group}/config", "admin", {"lease_ms": LEASE_MS, "heartbeat_interval_ms": HEARTBEAT_MS})
