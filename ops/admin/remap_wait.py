"""``topic remap --wait``: follow the topic's route (SSE) until every moved queue is writable on its new segment.

The progress bar is rich's, on stderr: rich was already in the environment (schemathesis brings it), draws a bar
only on a terminal and prints nothing to a pipe, so a script's stdout keeps exactly the one answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from client import RouteSubscription

from .options import CliError, Globals

REMAP_WAIT_S_DEFAULT = 120.0   # a seal waits for the old broker; a dead one is fenced after its session timeout
TIMEOUT = "TIMEOUT"            # a client-side code: the wait ended, the remap itself went through


def writable_queues(route: dict[str, Any], moved_gens: dict[int, int]) -> set[int]:
    """The moved queues whose writable segment is the move's (or a later) generation."""
    return {q["queue"] for q in route["queues"]
            if q["queue"] in moved_gens and q["writable"] and q["gen"] >= moved_gens[q["queue"]]}


async def wait_writable(g: Globals, topic: str, version: int, moved: Sequence[dict[str, Any]],
                        timeout_s: float) -> None:
    gens = {m["queue"]: m["gen"] for m in moved}
    console = Console(stderr=True)
    with Progress(TextColumn("remap {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=not console.is_terminal) as progress:
        bar = progress.add_task(topic, total=len(gens))

        def all_writable(route: dict[str, Any]) -> bool:
            done = writable_queues(route, gens)
            progress.update(bar, completed=len(done))
            return len(done) == len(gens)

        async with RouteSubscription(g.endpoints, g.need_token(), [topic], ssl_context=g.ssl_context) as routes:
            await routes.get(topic, min_version=version)
            try:
                await routes.wait_for(topic, all_writable, timeout_s)
            except TimeoutError:
                raise CliError(TIMEOUT, f"remap of {topic!r} is in the log (version {version}), but not every moved "
                                        f"queue was writable within {timeout_s:g} s: see `stator topic describe "
                                        f"{topic}`") from None
