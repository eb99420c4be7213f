"""A Prometheus scrape of a node, parsed, and one sample's value by name and labels.
"""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, list]:
    """Every sample of the scrape by sample name: [(labels, value)]."""
    async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=15)) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    found = [v for ls, v in samples.get(name, []) if all(ls.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]
