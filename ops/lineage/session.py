"""The Spark session lineage runs on.

- ``master`` given: that master (``local[*]``, ``spark://``, ``yarn``, ``k8s://``);
- ``remote`` given: Spark Connect (``sc://host:15002``; its client, PySpark's connect extra, is in ``stator[spark]``);
- neither: whatever launched us decides (``spark-submit --master ...`` and ``spark-defaults.conf``), else Spark's own
  default, ``local[*]``.
Times are UTC in every session, so dates and ISO strings never depend on where the driver runs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from .errors import LineageError

APP_NAME = "stator-lineage"
BASE_CONF = {"spark.sql.session.timeZone": "UTC"}
LOG_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
CONNECT_PORT = 15002        # Spark Connect's default
REACH_TIMEOUT_S = 10.0
# Only for a session this process starts itself on a local master: errors-only logs, no UI port, no progress bars.
LOCAL_CONF = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
              "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG_CONFIG}"}


def build(master: str | None = None, remote: str | None = None, conf: Mapping[str, str] | None = None,
          app_name: str = APP_NAME) -> SparkSession:
    if master and remote:
        raise ValueError("give a master or a Spark Connect remote, not both")
    builder = SparkSession.builder.appName(app_name)
    settings = dict(BASE_CONF)
    if remote:
        from pyspark.sql.connect.utils import check_dependencies
        check_dependencies()     # a missing client package first: no server can make up for it
        reachable(remote)
        builder = builder.remote(remote)
    else:
        if master:
            builder = builder.master(master)
        if (master or "local").startswith("local") and "PYSPARK_GATEWAY_PORT" not in os.environ:
            # The machine's hostname may resolve to an address Spark warns about; a local session needs only loopback.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            settings.update(LOCAL_CONF)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def reachable(remote: str) -> None:
    """Refuse at once a Spark Connect server nobody listens at: PySpark's client would retry for about ten minutes
    (15 tries, backing off to a minute) and then end in a traceback."""
    url = urlparse(remote)
    try:
        port = url.port or CONNECT_PORT
    except ValueError:
        port = None
    if url.scheme != "sc" or not url.hostname or port is None:
        raise LineageError("INVALID_ARGUMENT", f"--remote {remote}: a Spark Connect URL is sc://host[:port]")
    try:
        with socket.create_connection((url.hostname, port), timeout=REACH_TIMEOUT_S):
            pass
    except OSError as e:
        raise LineageError("UNAVAILABLE", f"no Spark Connect server at {url.hostname}:{port} ({e.strerror or e})") \
            from e
