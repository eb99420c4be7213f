"""Python imports this module at start-up in every process that has this folder on its PYTHONPATH; ops/bench/
write_path.py puts it there for the meta nodes it starts. In a meta node (``... meta serve``) with
STATOR_WRITE_PATH_DIR set, it stamps the calls ops/bench/write_path_stamps.py names; anywhere else it does nothing."""

import os
import sys

if os.environ.get("STATOR_WRITE_PATH_DIR") and "meta" in sys.argv and "serve" in sys.argv:
    from ops.bench import write_path_stamps

    write_path_stamps.install(os.environ[write_path_stamps.DIR_ENV])
