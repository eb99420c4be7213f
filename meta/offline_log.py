"""Reading a stopped node's own log (snapshot + journal) without joining the cluster.

Used by `stator meta rebuild-projection`: replay the committed entries through the same state machine the node runs,
then hand the retained event history to the projection. Both files are this node's own, written by pysyncobj,
so unpickling them trusts nothing from the network.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle

from pysyncobj.journal import FileJournal

from .config import MetaConfig
from .image import Image
from .raft_node import decode_entry
from .state_machine import StateMachine

REGULAR_COMMAND = 0  # pysyncobj's _COMMAND_TYPE.REGULAR: the first byte of a journal entry


def load_image(config: MetaConfig) -> Image:
    """The image as of the last committed entry in the node's data directory."""
    snapshot = os.path.join(config.data_dir, "raft.snapshot")
    image, last_index = Image(), 0
    if os.path.exists(snapshot):
        with gzip.open(snapshot, "rb") as f:
            data = pickle.load(f)
        image, last_index = Image(data[0]["image_data"]), data[1][1]
    journal_path = os.path.join(config.data_dir, "raft.journal")
    if os.path.exists(journal_path):
        journal = FileJournal(journal_path)
        try:
            commit = journal.getRaftCommitIndex()
            machine = StateMachine(image)
            for i in range(len(journal)):
                command, index, _term = journal[i]
                if index <= last_index or index > commit or not command or command[0] != REGULAR_COMMAND:
                    continue
                decoded = pickle.loads(command[1:])
                args = decoded[1] if isinstance(decoded, tuple) and len(decoded) > 1 else ()
                if len(args) == 1 and isinstance(args[0], str):
                    machine.apply(decode_entry(args[0]))
        finally:
            journal._destroy()
    return image


def rebuild_projection(config: MetaConfig) -> int:
    from .projection import rebuild
    image = load_image(config)
    return rebuild(config.projection_url, (json.loads(e) for e in image.data["history"]))
