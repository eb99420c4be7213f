"""Running a broker in the foreground until SIGTERM/SIGINT."""

from __future__ import annotations


def run_broker(config_path: str, power_loss_ledger: bool = False) -> None:
    from runtime import event_loop
    from runtime.logging import configure
    from runtime.serve import serve_app, start_power_loss_ledger

    from .api.app import make_app
    from .config import load

    config = load(config_path)
    configure(config.log_level, broker=config.broker)
    if power_loss_ledger:
        start_power_loss_ledger(config.data_dir)
    event_loop.run(serve_app(make_app(config), config.http_host, config.http_port, config.tls,
                             config.http_connections_max, config.metrics_listen))
