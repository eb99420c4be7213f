"""The one error lineage commands raise for something the operator must act on: ``CODE: message`` on one line."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

INSTALL = "pip install 'stator[spark]'"
# Modules of the `spark` extra (and what pip calls them) that may be missing from an install without it. Only these
# become the one-line error: an ImportError of anything else is a bug and keeps its traceback.
OPTIONAL = {"pyspark": "pyspark", "py4j": "py4j", "pyarrow": "pyarrow", "pandas": "pandas", "numpy": "numpy",
            "grpc": "grpcio", "grpc_status": "grpcio-status", "google": "googleapis-common-protos",
            "zstandard": "zstandard"}


class LineageError(RuntimeError):
    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@contextlib.contextmanager
def packages_needed() -> Iterator[None]:
    """A package of the `spark` extra that is missing (or too old for PySpark) becomes PACKAGE_NOT_INSTALLED, naming
    the extra to install, instead of the import's traceback."""
    try:
        yield
    except ImportError as e:
        missing = missing_package(e)
        if missing is None:
            raise
        raise LineageError("PACKAGE_NOT_INSTALLED", f"{missing}; install the spark extra: {INSTALL}") from e


def missing_package(e: ImportError) -> str | None:
    """What is missing, said in a few words, or None when ``e`` is not about the `spark` extra."""
    condition = getattr(e, "getCondition", None)
    if condition is not None:
        # PySpark's own checks (Spark Connect's grpcio and friends, pandas, pyarrow) name the package and version.
        params = e.getMessageParameters() or {}
        name, need = params.get("package_name"), params.get("minimum_version")
        if condition() == "PACKAGE_NOT_INSTALLED" and name:
            return f"{name} >= {need} is not installed" if need else f"{name} is not installed"
        if condition() == "UNSUPPORTED_PACKAGE_VERSION" and name:
            return f"{name} {params.get('current_version')} is installed, PySpark needs {need} or later"
        return None
    top = (e.name or "").split(".")[0]
    if isinstance(e, ModuleNotFoundError) and top in OPTIONAL:
        pip_name = "protobuf" if (e.name or "").startswith("google.protobuf") else OPTIONAL[top]
        return f"{pip_name} is not installed (no module {e.name})"
    return None
