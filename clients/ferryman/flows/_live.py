"""A running service's flow, kept equal to the flow store's definition: what wrappers and dedupers use.

The rule for the configuration file and the API: **the store wins**. A service started with a
flow of the file writes it to the store only when the store has no flow of that name
(`FlowRegistry.seed`, done by the deduper, which owns flows); from then on the store's
definition is the flow, and ``ferryman flows apply -f FILE`` is how later file changes reach it.
A difference between the store and the file in a field that can change live is applied, with a
warning; one in a field that cannot (staging topic, exactly-once, ...) stops the service with a
configuration error naming the field, since running either definition would be a surprise.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Mapping
from typing import Final

import msgspec

from ferryman.config import ClusterConfig, FlowConfig
from ferryman.errors import ConfigError, FlowFieldError, FlowNotLiveError, KafkaOperationError
from ferryman.flows._model import check_change, proto_field, to_config
from ferryman.flows._registry import FlowRegistry
from ferryman.flows._store import FlowStore
from ferryman.flows._watch import FlowWatcher

_log = logging.getLogger(__name__)

#: take()'s answer when the store said nothing new.
UNCHANGED: Final = "unchanged"

#: FlowConfig fields that are this deployment's own decisions, not part of the flow resource (the Flow
#: message has no such field): a service keeps its file's values whatever the store holds.
LOCAL_FIELDS: Final = ("acknowledged_losses",)


def with_local_fields(stored: FlowConfig, local: FlowConfig) -> FlowConfig:
    """Stored with local's `LOCAL_FIELDS` (an acknowledged loss in the file survives the store winning)."""
    return msgspec.structs.replace(stored, **{name: getattr(local, name) for name in LOCAL_FIELDS})


def differing_fields(a: FlowConfig, b: FlowConfig) -> list[str]:
    """The Flow field names in which a and b differ (``naming.renames``, ``topics``, ...)."""
    out: list[str] = []
    for name in a.__struct_fields__:
        if name == "naming":
            out += [f"naming.{n}" for n in a.naming.__struct_fields__ if getattr(a.naming, n) != getattr(b.naming, n)]
        elif getattr(a, name) != getattr(b, name):
            out.append(name)
    return [proto_field(n) for n in out]


def seed_and_check(registry: FlowRegistry, flow: FlowConfig) -> FlowConfig:
    """The flow as the store has it, after storing flow if the store had none of its name.

    Raises:
        ConfigError: the store's flow differs from flow in a field that cannot change live.
    """
    stored = with_local_fields(to_config(registry.seed(flow)), flow)
    try:
        check_change(flow, stored)
    except (FlowFieldError, FlowNotLiveError) as exc:
        raise ConfigError(
            f"flow {flow.name!r} in the flow store of cluster {registry.store_alias!r} differs from the "
            f"configuration in {exc.field}, which cannot change on a running flow; the store wins: "
            "make the file match, or delete the flow (ferryman flows delete) and start again"
        ) from exc
    if stored != flow:
        _log.warning(
            "flow %s in the flow store differs from the configuration in %s: the store wins "
            "(ferryman flows apply -f FILE changes it)",
            flow.name,
            ", ".join(differing_fields(flow, stored)),
        )
    return stored


def stored_or(store: FlowStore, flow: FlowConfig) -> FlowConfig:
    """The store's definition of flow when it has one (a wrapper starting: the store wins), else flow.

    Raises:
        ConfigError: the store's flow differs from flow in a field that cannot change live.
    """
    stored = store.read().get(flow.name) if store.exists() else None
    if stored is None:
        return flow
    config = with_local_fields(to_config(stored), flow)
    try:
        check_change(flow, config)
    except (FlowFieldError, FlowNotLiveError) as exc:
        raise ConfigError(
            f"flow {flow.name!r} in the flow store of cluster {store.alias!r} differs from the configuration in "
            f"{exc.field}, which cannot change on a running flow; the store wins: make the file match"
        ) from exc
    return config


#: Budget of each cluster's answer when a flow is looked up in the stores at start-up.
_LOOKUP_TIMEOUT_S = 15.0


def from_stores(clusters: Mapping[str, ClusterConfig], name: str, *, client_id: str) -> FlowConfig:
    """The flow name as stored in the flow store of one of clusters: a service runs a flow only the API made.

    Each cluster's store holds the flows into it.

    Raises:
        ConfigError: no cluster's store has it (clusters that did not answer are named).
    """
    silent: list[str] = []
    for alias, cluster in clusters.items():
        store = FlowStore(alias, cluster, client_id=client_id, timeout_s=_LOOKUP_TIMEOUT_S)
        try:
            stored = store.read().get(name) if store.exists() else None
        except KafkaOperationError as exc:
            _log.warning("flow store of cluster %s not read: %s", alias, exc)
            silent.append(alias)
            continue
        if stored is not None and stored.target_alias == alias:
            _log.info("flow %s taken from the flow store of cluster %s", name, alias)
            return to_config(stored)
    unread = f" (no answer from {', '.join(silent)})" if silent else ""
    raise ConfigError(f"no flow named {name!r} in the configuration nor in the flow stores of its clusters{unread}")


class LiveFlow:
    """Follows the running flow in the store; the service's loop thread `take`s what changed.

    Only changes the service can apply reach it: a definition that changes a field that cannot
    change live (the flow was deleted and created again differently) is reported as None, as a
    deletion is: the service goes idle until the flow is back as it runs it.
    """

    def __init__(self, cluster: ClusterConfig, flow: FlowConfig, *, client_id: str) -> None:
        self.flow = flow
        #: The flow is not in the store (deleted), or there as this service cannot run it.
        self.deleted = False
        self._changes: queue.SimpleQueue[FlowConfig | None] = queue.SimpleQueue()
        self._watcher = FlowWatcher(cluster, flow.name, self._changes.put, client_id=client_id)

    def start(self) -> None:
        """Start following the store."""
        self._watcher.start()

    def stop(self) -> None:
        """Stop following it (idempotent)."""
        self._watcher.stop()

    def take(self) -> FlowConfig | str | None:
        """The latest applicable definition since the last call, None (deleted), or `UNCHANGED`."""
        latest: FlowConfig | str | None = UNCHANGED
        while True:
            try:
                latest = self._changes.get_nowait()
            except queue.Empty:
                break
        if isinstance(latest, FlowConfig):
            latest = with_local_fields(latest, self.flow)
        if not isinstance(latest, FlowConfig):
            if latest is None and not self.deleted:
                self.deleted = True
                return None
            return UNCHANGED
        if latest == self.flow and not self.deleted:
            return UNCHANGED
        try:
            check_change(self.flow, latest)
        except (FlowFieldError, FlowNotLiveError) as exc:
            _log.error("flow %s changed in %s, which this running service cannot take over: idle", self.flow.name, exc)
            self.deleted = True
            return None
        changed = differing_fields(self.flow, latest)
        _log.info("flow %s changed in the flow store: %s", self.flow.name, ", ".join(changed) or "back again")
        self.flow, self.deleted = latest, False
        return latest
