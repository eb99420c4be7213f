"""Config files: unknown keys are refused by name, every value is typed and bounded, errors are one line."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from broker import config as broker_config
from meta import config as meta_config
from meta.raft.node import RaftTuning
from runtime.config_file import ConfigError
from tests.support.config_files import META_TOKENS, TOKENS, broker_raw, meta_raw, write

CLI_TIMEOUT_S = 30.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- what a good file becomes -------------------------------------------------------------------------------------

def test_a_meta_file_becomes_the_same_dataclass_as_before(tmp_path):
    c = meta_config.load(write(tmp_path, "m1.json", meta_raw()))
    assert isinstance(c, meta_config.MetaConfig)
    assert (c.node, c.http_host, c.http_port, c.raft) == ("m1", "127.0.0.1", 7100, "127.0.0.1:7101")
    assert c.data_dir == os.path.join(tmp_path, "data")
    assert c.projection_url == f"sqlite:///{os.path.join(tmp_path, 'data', 'projection.db')}"
    assert c.members[1] == meta_config.Member("m2", "127.0.0.1:7103", "http://127.0.0.1:7102")
    assert c.partners == ["127.0.0.1:7103"] and c.tokens.role_of(TOKENS["client"]) == "client"
    assert c.tokens.role_of(TOKENS["broker"]) is None   # no shared broker token: each broker has its own
    assert c.raft_tuning == RaftTuning() and c.log_level == "info" and c.history_window == 200_000
    assert meta_config.parse(meta_raw(history_window=50)).history_window == 50
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.node = "m2"  # type: ignore[misc]


def test_a_toml_file_reads_like_json(tmp_path):
    path = os.path.join(tmp_path, "b1.toml")
    with open(path, "w") as f:
        f.write('broker = "b1"\ndata_dir = "data"\nhttp = "127.0.0.1:7150"\nmeta = ["http://127.0.0.1:7100/"]\n'
                'flush = "interval"\nretention_ms = 86400000\n[tokens]\nbroker = "bbbbbbbbbbbbbbbb"\n'
                'client = "cccccccccccccccc"\n')
    c = broker_config.load(path)
    assert (c.broker, c.http_port, c.meta_urls, c.flush) == ("b1", 7150, ("http://127.0.0.1:7100",), "interval")
    assert (c.retention_ms, c.retention_bytes, c.token, c.admin_token) == (86_400_000, None, "b" * 16, None)


def test_meta_raft_tuning_overrides_reach_the_dataclass():
    c = meta_config.parse(meta_raw(raft_tuning={"compaction_min_entries": 500, "election_timeout_max_s": 0.6}))
    assert c.raft_tuning == RaftTuning(compaction_min_entries=500, election_timeout_max_s=0.6)


def test_the_raft_tuning_schema_knows_every_raft_tuning_field():
    # A field added to RaftTuning must be added to the schema too, or it could not be set from a config file.
    schema = meta_config._RaftTuningSchema
    assert list(schema.model_fields) == [f.name for f in dataclasses.fields(RaftTuning)]
    assert RaftTuning(**schema().model_dump()) == RaftTuning()


# -- unknown keys -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, key", [
    (meta_raw(projection_ulr="postgresql+psycopg://db/x"), "'projection_ulr' (did you mean 'projection_url'?)"),
    (meta_raw(raft_tuning={"election_timeout_s": 1.0}), "'raft_tuning.election_timeout_s'"),
    (meta_raw(tokens={**META_TOKENS, "admn": "x" * 16}), "'tokens.admn' (did you mean 'admin'?)"),
    (meta_raw(members=[{"node": "m1", "raft": "127.0.0.1:7101", "url": "http://127.0.0.1:7100", "zone": "a"}]),
     "'members.0.zone'"),
])
def test_meta_refuses_an_unknown_key_by_name(tmp_path, raw, key):
    with pytest.raises(ConfigError) as e:
        meta_config.load(write(tmp_path, "m1.json", raw))
    assert f"unknown key {key}" in str(e.value) and "m1.json" in str(e.value)


@pytest.mark.parametrize("raw, key", [
    (broker_raw(retention_msec=1000), "'retention_msec' (did you mean 'retention_ms'?)"),
    (broker_raw(tokens={"broker": "b" * 16, "client": "c" * 16, "clinet": "c" * 16}), "'tokens.clinet'"),
])
def test_broker_refuses_an_unknown_key_by_name(raw, key):
    with pytest.raises(ConfigError) as e:
        broker_config.parse(raw)
    assert f"unknown key {key}" in str(e.value)


# -- bad values ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, says", [
    ({"http": "127.0.0.1:0"}, "http: port must be an integer in [1, 65535]"),
    ({"http": "127.0.0.1:65536"}, "http: port must be an integer in [1, 65535]"),
    ({"http": "7100"}, "http: must be host:port"),
    ({"secret": "s" * 15}, "secret: String should have at least 16 characters"),
    ({"tokens": {**META_TOKENS, "client": TOKENS["admin"]}}, "tokens.admin and tokens.client must differ"),
    ({"node": "m9"}, "node 'm9' is not among members"),
    ({"members": [{"node": "m1", "raft": "127.0.0.1:7101", "url": "http://127.0.0.1:7100"},
                  {"node": "m1", "raft": "127.0.0.1:7103", "url": "http://127.0.0.1:7102"}]},
     "members: each node must be unique"),
    ({"members": []}, "members: List should have at least 1 item"),
    ({"members": [{"node": "m1", "raft": "127.0.0.1:7101", "url": "ftp://127.0.0.1:7100"}]}, "members.0.url"),
    ({"offset_budget": "1000"}, "offset_budget: Input should be a valid integer"),
    ({"offset_budget": 0}, "offset_budget: Input should be greater than or equal to 1"),
    ({"session_timeout_ms": 10**12}, "session_timeout_ms: Input should be less than or equal to"),
    ({"session_timeout_ms": 1000, "heartbeat_interval_ms": 1000}, "heartbeat_interval_ms must be shorter"),
    ({"raft_tuning": {"connection_timeout_s": 0}}, "raft_tuning.connection_timeout_s: Input should be greater than 0"),
    ({"raft_tuning": {"election_timeout_min_s": 0.1}}, "election_timeout_min_s must exceed 3 x append_entries"),
    ({"projection_url": "not a url"}, "projection_url: must be a SQLAlchemy database URL"),
    ({"log_level": "loud"}, "log_level: Input should be 'debug', 'info'"),
    ({"history_window": 9}, "history_window: Input should be greater than or equal to 10"),
    ({"history_window": 10**9}, "history_window: Input should be less than or equal to 2000000"),
])
def test_meta_refuses_a_bad_value_naming_its_key(changes, says):
    with pytest.raises(ConfigError) as e:
        meta_config.parse(meta_raw(**changes))
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("changes, says", [
    ({"retention_ms": "abc"}, 'retention_ms: Input should be a valid integer (got "abc")'),
    ({"retention_ms": -5}, "retention_ms: Input should be greater than or equal to 1 (got -5)"),
    ({"retention_bytes": 0}, "retention_bytes: Input should be greater than or equal to 1"),
    ({"retention_bytes": 1.5}, "retention_bytes: Input should be a valid integer"),
    ({"flush": "sometimes"}, "flush: Input should be 'fsync' or 'interval'"),
    ({"flush": "group"}, "flush: Input should be 'fsync' or 'interval'"),   # storage's own policy, not a broker's
    ({"sync_scope": "disk"}, "sync_scope: Input should be 'filesystem' or 'file'"),
    ({"flush_interval_ms": 0}, "flush_interval_ms: Input should be greater than or equal to 1"),
    ({"http": "127.0.0.1:99999"}, "http: port must be an integer in [1, 65535]"),
    ({"meta": []}, "meta: List should have at least 1 item"),
    ({"broker": "b 1"}, "broker: String should match pattern"),
    ({"tokens": {"client": "c" * 16}}, "missing the broker token"),
    ({"tokens": {"broker": "short", "client": "c" * 16}}, "tokens.broker: String should have at least 16"),
])
def test_broker_refuses_a_bad_value_naming_its_key(changes, says):
    with pytest.raises(ConfigError) as e:
        broker_config.parse(broker_raw(**changes))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_token_is_never_quoted_back_in_an_error():
    with pytest.raises(ConfigError) as e:
        broker_config.parse(broker_raw(tokens={"broker": "hunter2", "client": "c" * 16}))
    assert "hunter2" not in str(e.value)


@pytest.mark.parametrize("text, says", [
    ('{"node": "m1",', "not valid JSON"),
    ('{"node": "m1", "node": "m2"}', "key 'node' given twice"),
    ('["m1"]', "must hold an object of settings, not a list"),
])
def test_a_file_that_is_not_a_settings_object_is_refused(tmp_path, text, says):
    path = os.path.join(tmp_path, "m1.json")
    with open(path, "w") as f:
        f.write(text)
    with pytest.raises(ConfigError, match=says):
        meta_config.load(path)


# -- the command line ---------------------------------------------------------------------------------------------

def run_cli(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "ops.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=CLI_TIMEOUT_S, cwd=ROOT)


@pytest.mark.parametrize("kind, raw, key", [
    ("meta", meta_raw(projection_ulr="postgresql+psycopg://db/x"), "projection_ulr"),
    ("broker", broker_raw(retention_ms="abc"), "retention_ms"),
    ("broker", broker_raw(retention_ms=-5), "retention_ms"),
])
def test_the_cli_prints_a_config_error_as_one_line_and_exits_2(tmp_path, kind, raw, key):
    r = run_cli(kind, "serve", "--config", write(tmp_path, "node.json", raw))
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], r.stderr
    assert not os.path.exists(os.path.join(tmp_path, "data")), "the node started before its config was checked"


def test_rebuild_projection_names_an_unreadable_snapshot_in_one_line(tmp_path):
    """An operator's rebuild on a data dir with a damaged (or old pickled) snapshot gets the reason, not a traceback."""
    os.makedirs(tmp_path / "data")
    (tmp_path / "data" / "raft.snapshot").write_bytes(b"\x80\x04not a snapshot")
    out = run_cli("meta", "rebuild-projection", "--config", write(tmp_path, "m1.json", meta_raw()))
    assert out.returncode == 1, out
    assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_sync_scope_filesystem_only_where_syncfs_reports_write_back_errors(monkeypatch):
    """Before Linux 5.8 syncfs(2) returned 0 after a failed write-back: group commit would acknowledge records the
    disk had dropped. There the default is "file", and "filesystem" asked for by name is refused, naming why."""
    def kernel(release: str) -> None:
        real = os.uname()
        monkeypatch.setattr(os, "uname", lambda: os.uname_result(
            (real.sysname, real.nodename, release, real.version, real.machine)))

    kernel("5.8.0")
    assert broker_config.parse(broker_raw()).sync_scope == "filesystem"
    kernel("5.4.0-150-generic")
    assert broker_config.parse(broker_raw()).sync_scope == "file"
    with pytest.raises(ConfigError) as e:
        broker_config.parse(broker_raw(sync_scope="filesystem"))
    assert "Linux 5.4.0-150-generic does not report write-back errors" in str(e.value)
