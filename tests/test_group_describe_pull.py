"""`stator group list|describe` for groups meta has no record of (issue 21): a pull group commits offsets on the
brokers and never joins through meta; an exclusive group whose members all left holds no lock naming its topics.
Both show their committed offsets and lag, read from the brokers of a real cluster; a name nobody knows is still
GROUP_NOT_FOUND."""

from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner

from ops.cli import main
from tests.support.meta_http import ok, wait_until

NO_ENV = {"STATOR_TOKEN": None, "STATOR_ENDPOINTS": None}
SEEN_WAIT_S = 20.0   # a commit is listed by its broker once durable (the offsets file's group commit)


def _cli(c, *args: str, code: int = 0):
    result = CliRunner().invoke(main, [*args, "--dir", c.dir], env=NO_ENV)
    assert result.exit_code == code, (args, result.exit_code, result.stdout, result.stderr, result.exception)
    return result


async def cli_json(c, *args: str):
    # CliRunner runs the command's own event loop: not in the test's.
    return json.loads((await asyncio.to_thread(_cli, c, *args, "-w", "json")).stdout)


async def _send(c, topic: str, queue: int, count: int) -> str:
    """``count`` messages to the queue's head broker; returns the broker's address."""
    route = await ok(c, "GET", f"/v1/routes/{topic}", "client")
    address = route["queues"][queue]["address"]
    await ok(c, "POST", f"/v1/messages/{topic}/{queue}", "client", url=address,
             json={"messages": [{"body": f"m{i}"} for i in range(count)]},
             headers={"X-Route-Version": str(route["version"])})   # the broker decides on at least this route
    return address


async def _describe_offsets(c, group: str, want: dict) -> dict:
    """``group describe`` once its offsets are ``want`` ({(topic, queue): (committed, max, lag)})."""
    seen: dict = {}

    async def shown() -> bool:
        result = await asyncio.to_thread(CliRunner().invoke, main, ["group", "describe", group, "--dir", c.dir,
                                                                     "-w", "json"], env=NO_ENV)
        if result.exit_code != 0:   # not listed by the brokers yet: GROUP_NOT_FOUND
            seen["last"] = result.stderr
            return False
        d = json.loads(result.stdout)
        seen.update(d)
        return {(o["topic"], o["queue"]): (o["committed_offset"], o["max_offset"], o["lag"])
                for o in d["offsets"]} == want

    try:
        await wait_until(shown, SEEN_WAIT_S, f"describe {group} showing {want}", interval_s=0.5)
    except AssertionError:
        raise AssertionError(f"describe {group}: {seen}") from None
    return seen


async def test_a_pull_group_and_a_memberless_exclusive_group_show_offsets_and_lag(full_cluster):
    c = full_cluster
    await ok(c, "POST", "/v1/topics", json={"topic": "ledger", "queues": 2}, expect=(201,))
    head0 = await _send(c, "ledger", 0, 5)
    head1 = await _send(c, "ledger", 1, 3)

    # A pull group: commits on the broker, never a heartbeat to meta.
    await ok(c, "PUT", "/v1/offsets/billing/ledger/0", "client", url=head0, json={"offset": 2})
    d = await _describe_offsets(c, "billing", {("ledger", 0): (2, 5, 3)})
    assert (d["group"], d["mode"], d["members"], d["assignments"], d["source"]) == ("billing", None, [], [], "brokers")
    listed = {g["group"]: g for g in (await cli_json(c, "group", "list"))["groups"]}
    assert listed["billing"] == {"group": "billing", "mode": None, "members": 0, "locks": 0, "version": 0,
                                 "source": "brokers"}
    rows = [line.split() for line in (await asyncio.to_thread(_cli, c, "group", "describe", "billing")).stdout
            .strip().splitlines()]
    header = rows.index(["TOPIC", "QUEUE", "COMMITTED", "MAX", "OFFSET", "LAG"])
    assert rows[header + 1] == ["ledger", "0", "2", "5", "3"]

    # An exclusive group that committed, then lost its only member: no lock names the topic any more.
    joined = await ok(c, "POST", "/v1/groups/workers/heartbeat", "client",
                      json={"member": "w1", "topics": ["ledger"], "mode": "exclusive"})
    token = {a["queue"]: a["token"] for a in joined["assignments"]}[1]
    await ok(c, "PUT", "/v1/offsets/workers/ledger/1", "client", url=head1, json={"offset": 1, "token": token})
    await ok(c, "POST", "/v1/groups/workers/leave", "client", json={"member": "w1"})
    d = await _describe_offsets(c, "workers", {("ledger", 1): (1, 3, 2)})
    assert d["members"] == [] and d["assignments"] == []
    assert "workers" in {g["group"] for g in (await cli_json(c, "group", "list"))["groups"]}

    # Known to nobody: still the one-line GROUP_NOT_FOUND; and the plain list (no include) is the image's alone.
    result = await asyncio.to_thread(_cli, c, "group", "describe", "nobody", code=1)
    assert result.stderr == "error: GROUP_NOT_FOUND: group 'nobody' does not exist\n" and result.stdout == ""
    plain = await ok(c, "GET", "/v1/groups", "client")
    assert "billing" not in {g["group"] for g in plain["groups"]}
    bad = await c.call("GET", c.meta_urls[0] + "/v1/groups?include=everything", "client")
    assert bad[0] == 400 and bad[1]["error"]["code"] == "INVALID_ARGUMENT"


async def test_a_pull_group_is_found_after_its_queue_moved_on_since_its_last_commit(full_cluster):
    # The new head broker holds no commit of the group; the old one still does, on an older segment.
    c = full_cluster
    await ok(c, "POST", "/v1/topics", json={"topic": "audit", "queues": 1, "brokers": ["b1"]}, expect=(201,))
    head = await _send(c, "audit", 0, 4)
    await ok(c, "PUT", "/v1/offsets/auditors/audit/0", "client", url=head, json={"offset": 3})
    await ok(c, "POST", "/v1/topics/audit/remap", json={"brokers": ["b2"]})
    listing = await ok(c, "GET", "/v1/offsets?group=auditors", "client", url=head)
    assert listing == {"groups": [{"group": "auditors", "topics": ["audit"]}], "truncated": False}
    d = await _describe_offsets(c, "auditors", {("audit", 0): (3, 4, 1)})
    assert d["source"] == "brokers"
    assert "auditors" in {g["group"] for g in (await cli_json(c, "group", "list"))["groups"]}
