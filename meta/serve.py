"""Running a meta node in the foreground until SIGTERM/SIGINT."""

from __future__ import annotations

import gc
import sys

from runtime import event_loop
from runtime.serve import StartupError, listening_socket, serve_app, start_power_loss_ledger

from .gc_tuning import GC_THRESHOLDS

GIL_SWITCH_INTERVAL_S = 0.001


def check_raft_address(raft: str) -> None:
    """A StartupError naming ``raft`` if its address cannot be bound: found before the raft transport, which retries
    a failed bind in the background, starts. Bound as the transport binds it (meta/raft/transport.py): the node's own
    host, never every interface, and let go at once."""
    from runtime.config_file import split_host_port

    host, port = split_host_port(raft)
    listening_socket(host, port, f"raft address {raft}").close()


def run_meta(config_path: str, power_loss_ledger: bool = False) -> None:
    from pysyncobj import SyncObjException

    from .api.app import make_app
    from .projection import writer_process, writer_zygote
    from .config import load
    from runtime.logging import configure

    config = load(config_path)
    configure(config.log_level, node=config.node)
    # Before any thread exists (the ledger's, the loop's, raft's): the projection writers are forked from it
    writer_zygote.start(writer_process.serve)
    if power_loss_ledger:
        start_power_loss_ledger(config.data_dir)
    # The Raft tick runs on the event loop, but its watchdog thread ticks while the loop is held, and the apply
    # thread applies large entries: each must get the interpreter promptly (heartbeats, commits), so the GIL is
    # handed over every 1 ms instead of every 5 ms.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    gc.set_threshold(*GC_THRESHOLDS)   # after the zygote starts; each projection writer sets them at its own start
    check_raft_address(config.raft)
    try:
        event_loop.run(serve_app(make_app(config), config.http_host, config.http_port, config.tls,
                                 config.http_connections_max, config.metrics_listen))
    except SyncObjException as e:
        # pysyncobj gave up binding after conf.maxBindRetries attempts (the port was taken after the check above).
        if e.errorCode != "BindError":
            raise
        raise StartupError(f"raft address {config.raft} is not available: pysyncobj could not bind it") from None
