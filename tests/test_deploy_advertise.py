"""Deployment across hosts: a broker bound to every interface registers the URL it advertises, and clients reach it
there (a route carries the registered address; a send goes through it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from broker import config as broker_config
from client import AdminClient, Producer, PullConsumer
from ops import devcluster
from runtime.config_file import ConfigError
from tests.support import cluster as cluster_mod
from tests.support.config_files import broker_raw

STOP_TIMEOUT_S = 15.0


def test_a_broker_bound_to_every_interface_must_advertise_an_address():
    with pytest.raises(ConfigError) as e:
        broker_config.parse(broker_raw(http="0.0.0.0:7150"))
    assert "binds every interface" in str(e.value) and "advertise" in str(e.value)
    c = broker_config.parse(broker_raw(http="0.0.0.0:7150", advertise="http://broker-1.example:7150/"))
    assert c.url == "http://broker-1.example:7150" and (c.http_host, c.http_port) == ("0.0.0.0", 7150)
    assert broker_config.parse(broker_raw()).url == "http://127.0.0.1:7150"   # no advertise: the bind address
    with pytest.raises(ConfigError, match="advertise: must be an http:// or https:// URL"):
        broker_config.parse(broker_raw(advertise="broker-1:7150"))


async def test_a_broker_bound_to_0_0_0_0_registers_and_serves_its_advertised_url(tmp_path):
    async with cluster_mod.running(str(tmp_path), 1, 0) as c:
        port = devcluster.free_base_port()
        advertised = f"http://127.0.0.1:{port}"
        cfg = {"broker": "b1", "data_dir": "data", "http": f"0.0.0.0:{port}", "advertise": advertised,
               "meta": c.meta_urls, "tokens": {"broker": c.token("broker"), "client": c.token("client")}}
        os.makedirs(tmp_path / "b1")
        (tmp_path / "b1" / "config.json").write_text(json.dumps(cfg))
        log = open(tmp_path / "b1.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "ops.cli", "broker", "serve", "--config",
                                 str(tmp_path / "b1" / "config.json")], stdout=log, stderr=subprocess.STDOUT,
                                cwd=tmp_path / "b1")
        try:
            devcluster.wait_ready([advertised])
            async with AdminClient(c.meta_urls, c.token("admin")) as admin:
                assert [(b["broker"], b["address"]) for b in await admin.brokers()] == [("b1", advertised)]
                await admin.create_topic("far", queues=1)
                assert (await admin.route("far"))["queues"][0]["address"] == advertised
            async with Producer(c.meta_urls, c.token("client"), "far") as producer:
                sent = await producer.send("over the advertised address")
            async with PullConsumer(c.meta_urls, c.token("client"), "far", "readers") as consumer:
                got = await consumer.poll(timeout_s=5.0)
            assert [(m.offset, m.text) for m in got] == [(sent.offsets[0], "over the advertised address")]
        finally:
            devcluster.stop_process(proc, STOP_TIMEOUT_S)
            log.close()
