"""The group_heartbeats benchmark runs end to end at a small size and reports what the issue asks for."""

import json
import subprocess
import sys


def test_a_small_run_reports_sustained_heartbeats_and_the_leave_handover():
    out = subprocess.run([sys.executable, "-m", "ops.bench.group_heartbeats", "--members", "60", "--groups", "6",
                          "--topics", "2", "--queues", "4", "--interval", "1", "--duration", "3",
                          "--leave-trials", "2"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    beats = r["heartbeats"]
    assert beats["failed"] == 0 and beats["answered"] == beats["sent"] >= 60 * 3 - 60, beats
    assert r["leases_lost"] == 0 and r["join_errors"] == {}
    assert r["admin_writes"]["ok"] > 0 and r["admin_writes"]["errors"] == 0
    assert r["leave_to_owned_again"]["trials"] == 2 and r["leave_to_owned_again"]["max_ms"] is not None
    assert set(r["checks"]) == {"heartbeats_sustained", "admin_write_p99_under_100_ms"}
