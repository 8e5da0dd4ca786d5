"""Replication flows as resources: the ``Flow`` model, its validation, the flow store, watching it.

The contract of the flows admin API (``ferryman.v1.FlowService``) in one place: the services
serve it (`FlowRegistry`) and follow it (`FlowWatcher`), the CLI and the admin client speak it.
"""

from ferryman.flows._cycles import describe as describe_cycle
from ferryman.flows._cycles import find_cycle
from ferryman.flows._live import UNCHANGED, LiveFlow, from_stores, seed_and_check, stored_or
from ferryman.flows._model import (
    IMMUTABLE_FIELDS,
    NOT_LIVE_FIELDS,
    canonical,
    check_change,
    etag_of,
    merged,
    same_definition,
    to_config,
    to_proto,
)
from ferryman.flows._registry import FlowRegistry
from ferryman.flows._store import FlowStore
from ferryman.flows._watch import FlowWatcher

__all__ = [
    "IMMUTABLE_FIELDS",
    "NOT_LIVE_FIELDS",
    "UNCHANGED",
    "FlowRegistry",
    "FlowStore",
    "FlowWatcher",
    "LiveFlow",
    "canonical",
    "check_change",
    "describe_cycle",
    "etag_of",
    "find_cycle",
    "from_stores",
    "merged",
    "same_definition",
    "seed_and_check",
    "stored_or",
    "to_config",
    "to_proto",
]
