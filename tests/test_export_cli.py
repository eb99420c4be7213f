"""`stator export` takes the admin CLI's global options (issue 21): --endpoints (before or after the subcommand, or
STATOR_ENDPOINTS), --token-file, --dir of a `stator dev` cluster; --meta still works, hidden; its help names the
token the history route takes. Against a real three-node meta cluster."""

from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner

from ops.cli import main
from tests.support.meta_http import ok

NO_ENV = {"STATOR_TOKEN": None, "STATOR_ENDPOINTS": None}


def _cli(*args: str, env: dict | None = None, code: int = 0):
    result = CliRunner().invoke(main, list(args), env={**NO_ENV, **(env or {})})
    assert result.exit_code == code, (args, result.exit_code, result.stdout, result.stderr, result.exception)
    return result


async def cli(*args: str, env: dict | None = None, code: int = 0):
    return await asyncio.to_thread(_cli, *args, env=env, code=code)   # the command runs its own event loop


async def test_export_takes_the_global_options(meta_cluster, tmp_path):
    c = meta_cluster
    for i in range(3):
        await ok(c, "PUT", "/v1/groups/g/config", json={"max_attempts": 3 + i})
    head = (await ok(c, "GET", "/v1/cluster?consistency=linearizable", "client"))["applied_version"]
    urls = ",".join(c.meta_urls)

    # --dir: the endpoints and the admin token of a `stator dev` cluster.
    said = json.loads((await cli("export", "--dir", c.dir, "--out", str(tmp_path / "a"), "-w", "json")).stdout)
    assert said["exported_after"] == 0 and said["last_version"] >= head and said["events"] == said["last_version"]
    # The global options before the subcommand, with the client token: the one the history route asks for.
    before = await cli("--endpoints", urls, "--token", c.token("client"), "-w", "json", "export", "--out",
                       str(tmp_path / "b"))
    assert json.loads(before.stdout)["last_version"] >= head
    # From the environment, and a token file (mode 600, as for every admin command).
    token_file = tmp_path / "client.token"
    token_file.write_text(c.token("client"))
    token_file.chmod(0o600)
    env = {"STATOR_ENDPOINTS": urls}
    again = await cli("export", "--out", str(tmp_path / "b"), "--token-file", str(token_file), "-w", "json",
                      env=env)
    assert json.loads(again.stdout)["events"] == 0    # incremental: nothing twice
    token_file.chmod(0o644)
    refused = await cli("export", "--out", str(tmp_path / "b"), "--token-file", str(token_file), env=env, code=1)
    assert refused.stderr.startswith(f"error: INVALID_ARGUMENT: token file {token_file}: permissions 0644")

    # --meta, the first spelling, still works (hidden); with --endpoints too it is a usage error.
    old = await cli("export", "--meta", c.meta_urls[0], "--out", str(tmp_path / "c"), "-w", "json",
                    env={"STATOR_TOKEN": c.token("client")})
    assert json.loads(old.stdout)["last_version"] >= head
    both = await cli("export", "--meta", urls, "--endpoints", urls, "--out", str(tmp_path / "d"), code=2)
    assert "not both" in both.stderr

    # No token: one line, before any call. (Export over TLS: tests/test_tls.py.)
    missing = await cli("export", "--endpoints", urls, "--out", str(tmp_path / "e"), code=1)
    assert missing.stderr == "error: UNAUTHENTICATED: no token: give --token, --token-file or --dir, or set " \
                             "STATOR_TOKEN\n"

    shown = (await cli("export", "--help")).stdout
    assert "--endpoints" in shown and "--dir" in shown and "--meta" not in shown
    assert "client token" in " ".join(shown.split())
