"""ops/bench/write_path.py: its probes still name real functions, a write's steps are found among stamps in their
order, and a small run on real nodes finds the path of its writes."""

import json
import subprocess
import sys

from ops.bench import write_path_stamps as stamps


def test_every_probe_names_a_function_that_exists():
    assert stamps.missing_probes() == []


def _one_write() -> tuple[int, int, dict, list[dict]]:
    """One write's stamps as a lone writer's leader and followers write them (times in ns from 0)."""
    leader_steps = list(stamps.LEADER_TO_FOLLOWERS)
    leader = {event: [1_000 * (i + 1)] for i, event in enumerate(leader_steps)}
    sent, done = leader["send0"][0], leader[leader_steps[-1]][0]   # the follower syncs while the leader does
    fast = {"read0": [sent + 500], "journal_add0": [sent + 600], "sync0": [sent + 700], "sync1": [done + 900],
            "flush1": [done + 1_000]}
    slow = {event: [t + 5_000] for event, [t] in fast.items()}
    # the leader after the fast follower's acknowledgement left; a stale read before it must not be taken
    ack = fast["flush1"][0]
    for i, event in enumerate(stamps.LEADER_AFTER_ACK):
        leader.setdefault(event, []).append(ack + 100 * (i + 1))
    leader["read0"].insert(0, ack - 50)
    for times in leader.values():
        times.sort()
    return 0, ack + 10_000, leader, [slow, fast]


def test_a_writes_steps_are_found_in_order_with_the_first_acknowledgement_first():
    t0, t1, leader, followers = _one_write()
    path = stamps.write_path(t0, t1, leader, followers)
    assert path is not None
    assert path["ack1.flush1"] == followers[1]["flush1"][0] and path["ack2.flush1"] == followers[0]["flush1"][0]
    assert path["answer.read0"] == path["ack1.flush1"] + 100     # not the read before the acknowledgement
    times = [path[f"leader.{e}"] for e in stamps.LEADER_TO_FOLLOWERS] + \
            [path[f"answer.{e}"] for e in stamps.LEADER_AFTER_ACK] + [path["client.answered"]]
    assert times == sorted(times)
    rows, found = stamps.step_medians([(t0, t1)], leader, followers)
    assert found == 1 and rows[-1]["step"] == "client.answered" and rows[-1]["us_from_send"] == t1 / 1000
    assert [r["us_from_send"] for r in rows] == sorted(r["us_from_send"] for r in rows)


def test_a_write_with_a_leader_step_missing_has_no_path():
    t0, t1, leader, followers = _one_write()
    del leader["sync1"]
    assert stamps.write_path(t0, t1, leader, followers) is None
    assert stamps.step_medians([(t0, t1)], leader, followers) == ([], 0)


def test_a_small_run_on_real_nodes_finds_the_path_of_its_writes():
    out = subprocess.run([sys.executable, "-m", "ops.bench.write_path", "--duration", "1.5", "--warmup", "0.5"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["writes"] > 0 and r["writes_with_a_path"] >= r["writes"] // 2, r
    steps = {row["step"] for row in r["steps"]}
    for step in ("leader.http_read0", "leader.propose0", "leader.send1", "leader.sync1", "ack1.sync1", "ack2.sync1",
                 "answer.read0", "answer.state_machine1", "answer.answer_write1", "client.answered"):
        assert step in steps, (step, sorted(steps))
