"""Names that cross the wire and stand in configs: topics, brokers, groups, nodes. One rule, read by the meta node's
commands, the configs of both kinds of node, and the client's own checks."""

from __future__ import annotations

import re

NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
BROKER_NAME_CHARS_MAX = 64   # a broker's name, and a meta node's (the configs name both by this rule)
