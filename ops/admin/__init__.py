"""The admin CLI (API.md, "Admin CLI"): one module per noun, built on the client library.

``options`` holds the global options and the error line, ``output`` the tables and JSON. ``register`` adds the
commands to the ``stator`` group of ops/cli.py.
"""

from __future__ import annotations

import click


def register(main: click.Group) -> None:
    from . import broker, cluster, group, history, messages, route, snapshot, topic
    for command in (cluster.cluster, topic.topic, route.route, history.history, group.group, snapshot.snapshot,
                    messages.produce, messages.consume):
        main.add_command(command)
    main.commands["broker"].add_command(broker.list_brokers)
