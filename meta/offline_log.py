"""Reading a stopped node's own log (snapshot + journal) without joining the cluster.

Used by `stator meta rebuild-projection`: replay the committed entries through the same state machine the node runs,
then hand the retained event history to the projection. The snapshot is read by the same parser the node restores
from (``snapshot_file``); the journal is this node's own, written by pysyncobj (``pysyncobj_shim``).
"""

from __future__ import annotations

import json
import os

from . import pysyncobj_shim as shim
from . import snapshot_file
from .config import MetaConfig
from .image import Image
from .raft_node import JOURNAL_FILE, SNAPSHOT_FILE, decode_entry
from .state_machine import StateMachine


def load_image(config: MetaConfig) -> Image:
    """The image as of the last committed entry in the node's data directory."""
    return image_from_data_dir(config.data_dir)


def image_from_data_dir(data_dir: str) -> Image:
    snapshot = os.path.join(data_dir, SNAPSHOT_FILE)
    image, last_index = Image(), 0
    if os.path.exists(snapshot):
        restored = snapshot_file.read(snapshot)
        image, last_index = Image(restored.image), restored.last_applied.index
    journal_path = os.path.join(data_dir, JOURNAL_FILE)
    if os.path.exists(journal_path):
        machine = StateMachine(image)
        for args in shim.committed_calls(journal_path, last_index):
            if len(args) == 1 and isinstance(args[0], str):
                machine.apply(decode_entry(args[0]))
    return image


def rebuild_projection(config: MetaConfig) -> int:
    from .projection import rebuild
    image = load_image(config)
    return rebuild(config.projection_url, (json.loads(e) for e in image.data["history"]))
