"""ops/constraints.txt pins what a fresh install takes (ops/setup-env.sh for CI, the demo and the tests; the image's
Dockerfile): a release made between a green suite and CI once turned main red (cryptography 51, 2026-12-05). These
tests keep the pins whole: every package pyproject.toml asks for is pinned, within the range it asks for, and this
environment (made by setup-env.sh) holds exactly the pinned versions."""

from __future__ import annotations

import importlib.metadata
import os
import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONSTRAINTS = os.path.join(ROOT, "ops", "constraints.txt")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def pins() -> dict[str, str]:
    out = {}
    with open(CONSTRAINTS) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = PIN.match(line)
            assert m, f"not a pin (name==version): {line!r}"
            out[canonicalize_name(m.group(1))] = m.group(2)
    return out


def requirements() -> list[Requirement]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        wanted += [Requirement(r) for r in extra]
    return [r for r in wanted if canonicalize_name(r.name) != canonicalize_name(project["name"])]


def test_every_package_pyproject_asks_for_is_pinned_within_its_range():
    pinned = pins()
    for r in requirements():
        name = canonicalize_name(r.name)
        assert name in pinned, f"{r.name} is not in ops/constraints.txt: run bash ops/update-constraints.sh"
        assert r.specifier.contains(pinned[name], prereleases=True), \
            f"{r.name}=={pinned[name]} is outside pyproject.toml's {r.specifier}"


def test_this_environment_holds_the_pinned_versions():
    """setup-env.sh installs with the constraints: a version other than the pin means it did not (or the venv is
    older than the file: run bash ops/setup-env.sh dev)."""
    drift = {}
    for name, version in pins().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            drift[name] = (version, None)
            continue
        if installed != version:
            drift[name] = (version, installed)
    assert drift == {}, f"pinned vs installed: {drift}"


def test_the_image_installs_with_the_constraints():
    with open(os.path.join(ROOT, "ops", "deploy", "Dockerfile")) as f:
        installs = [line for line in f if line.startswith("RUN pip install")]
    assert installs and all(" -c /src/ops/constraints.txt " in line for line in installs), installs
