"""The `stator` console script of the interpreter running the tests: found beside it, not by a path relative to
the working directory (mutmut runs the tests from its mutants/ copy, where no .venv is)."""

from __future__ import annotations

import os
import sys

STATOR = os.path.join(os.path.dirname(sys.executable), "stator")
