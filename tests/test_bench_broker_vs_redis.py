"""The broker_vs_redis benchmark runs end to end for 2 s with one generator: one JSON object with both sides, each of
which read back exactly what it stored, and stored exactly what it acknowledged.

Not skipped without redis-server: CI installs it (ops/system-packages.sh, from ops/test.sh), so a missing binary is
a broken machine, and the bench's own refusal is the failure message."""

import json
import shutil
import subprocess
import sys

PHASE_KEYS = {"messages", "seconds", "messages_per_s", "latency_ms", "cpu_cores", "server_cpu_s"}


def test_a_short_run_reports_both_sides_and_each_read_back_what_it_produced():
    assert shutil.which("redis-server"), "redis-server is missing: bash ops/system-packages.sh redis (as root)"
    out = subprocess.run([sys.executable, "-m", "ops.bench.broker_vs_redis", "--duration", "2", "--generators", "1"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["benchmark"] == "broker_vs_redis"
    assert r["setup"]["message_bytes"] == 1024 and r["setup"]["batch"] == 100 and r["setup"]["generators"] == 1
    for side in ("redis", "stator"):
        s = r[side]
        for phase in ("produce", "consume"):
            got = s[phase]
            assert PHASE_KEYS <= set(got), (side, phase, got)
            assert got["messages"] > 0 and got["messages_per_s"] > 0, (side, phase, got)
            assert got["latency_ms"]["p50"] <= got["latency_ms"]["p99"], (side, phase, got)
            assert got["server_cpu_s"] is not None and got["server_cpu_s"] > 0, (side, phase, got)
        produced, consumed = s["produce"]["messages"], s["consume"]["messages"]
        assert produced % 100 == 0, s
        # Everything stored (the warm-up's batches, then the measured ones) is read back, no more, no less.
        assert s["stored_after_produce"] - s["stored_before_produce"] == produced, s
        assert consumed == s["stored_after_produce"] >= produced, s
        assert s["checks"] == {"stored_growth_equals_produced": True, "consumed_equals_stored": True}, s
    ratios = r["ratio_stator_to_redis"]
    assert ratios["produce_messages_per_s"] == round(
        r["stator"]["produce"]["messages_per_s"] / r["redis"]["produce"]["messages_per_s"], 3)
    assert ratios["produce_p99_ms"] > 0
