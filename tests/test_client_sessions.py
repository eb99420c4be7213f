"""Sessions closed (issue 21): the TLS client pattern of docs/operations.md, run as written against a real cluster
serving HTTPS with client certificates, leaves no "Unclosed client session" and no ResourceWarning; a session lent to
a client stays the lender's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import aiohttp
import pytest

from client import Producer, PullConsumer
from wire.tls import TlsFiles, client_context
from tests.support.tls_cluster import TOKENS, tls_cluster  # noqa: F401 (the fixture: one meta node and one broker, mutual TLS)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "docs", "operations.md")
RUN_TIMEOUT_S = 120


def guide_tls_pattern() -> str:
    """The Python block of the guide's "TLS and tokens" section, as written."""
    with open(GUIDE) as f:
        text = f.read()
    section = text[text.index("## TLS and tokens"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the TLS section shows one Python pattern"
    return blocks[0]


async def test_the_guides_tls_pattern_closes_every_session(tls_cluster, tmp_path):  # noqa: F811
    certs, meta_url, _ = tls_cluster
    imports = [line for line in guide_tls_pattern().splitlines() if line.startswith(("from ", "import "))]
    body = [line for line in guide_tls_pattern().splitlines() if not line.startswith(("from ", "import "))]
    script = "\n".join([
        "import asyncio, gc", *imports,
        f"CERT, KEY, CA = {certs.client.cert!r}, {certs.client.key!r}, {certs.ca!r}",
        f"META_URLS, ADMIN_TOKEN, CLIENT_TOKEN = [{meta_url!r}], {TOKENS['admin']!r}, {TOKENS['client']!r}",
        "async def main():",
        textwrap.indent("\n".join(body), "    "),
        "    print('created', created['topic'])",
        "asyncio.run(main())",
        "gc.collect()   # a session nobody closed says so when it is collected",
    ])
    path = tmp_path / "pattern.py"
    path.write_text(script)
    # -X dev shows every ResourceWarning; -W error makes one an error where it can be raised.
    run = subprocess.run([sys.executable, "-X", "dev", "-W", "error::ResourceWarning", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "created orders"
    for sign in ("Unclosed", "ResourceWarning", "unclosed"):
        assert sign not in run.stderr, run.stderr


async def test_a_lent_session_stays_open_and_tls_goes_one_way(tls_cluster):  # noqa: F811
    certs, meta_url, _ = tls_cluster
    ctx = client_context(TlsFiles(certs.client.cert, certs.client.key, certs.ca))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        producer = Producer(meta_url, TOKENS["client"], "lent", session=session)
        await producer.close()
        assert not session.closed   # others may still use it: its lender closes it
        with pytest.raises(ValueError, match="not both"):
            PullConsumer(meta_url, TOKENS["client"], "lent", "g", session=session, ssl_context=ctx)
