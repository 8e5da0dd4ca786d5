"""The operations of the flows admin API on a cluster's flow store, with every check in order.

`FlowRegistry` is what ``FlowService`` calls (the gRPC servicer only translates). Each change
is one `FlowStore.write`: the checks run on the flows as committed when the write fenced the
other writers, so two concurrent updates based on one etag cannot both succeed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from google.protobuf import field_mask_pb2, timestamp_pb2

from ferryman.config import ClusterConfig, FlowConfig
from ferryman.deadline import NO_DEADLINE, Deadline
from ferryman.errors import (
    FlowCycleError,
    FlowExistsError,
    FlowFieldError,
    FlowNotFoundError,
    FlowStoreBusyError,
    StaleEtagError,
)
from ferryman.flows._cycles import describe, find_cycle
from ferryman.flows._model import (
    by_name,
    canonical,
    check_aliases,
    check_change,
    merged,
    same_definition,
    stamp,
    to_config,
    to_proto,
)
from ferryman.flows._store import Change, FlowStore
from ferryman.v1 import flows_pb2

_log = logging.getLogger(__name__)


class FlowRegistry:
    """Create, read, change and delete the flows stored in one cluster (the flows into it)."""

    def __init__(
        self, clusters: Mapping[str, ClusterConfig], store_alias: str, *, client_id: str, timeout_s: float = 30.0
    ) -> None:
        """A registry of the flows into clusters[store_alias].

        Args:
            clusters: every cluster the server knows, by alias (flows may only name these; their
                stores are read for the cycle check).
            store_alias: the cluster whose store this registry writes.
            client_id: client.id prefix of the Kafka clients.
            timeout_s: budget of each store read or write attempt.
        """
        self._clusters = dict(clusters)
        self.store_alias = store_alias
        self._stores = {
            alias: FlowStore(alias, cluster, client_id=client_id, timeout_s=timeout_s)
            for alias, cluster in clusters.items()
        }
        self.store = self._stores[store_alias]
        self._topic_ready = False

    def _own(self) -> FlowStore:
        if not self._topic_ready:
            self.store.ensure_topic()
            self._topic_ready = True
        return self.store

    # ------------------------------------------------------------------ reads
    def get(self, name: str, deadline: Deadline = NO_DEADLINE) -> flows_pb2.Flow:
        """The stored flow name.

        Raises:
            FlowNotFoundError: none of that name.
        """
        flows = self._own().read(deadline)
        if name not in flows:
            raise FlowNotFoundError(f"no flow named {name!r} in cluster {self.store_alias!r}")
        return flows[name]

    def list_flows(self, deadline: Deadline = NO_DEADLINE) -> list[flows_pb2.Flow]:
        """Every stored flow, by name."""
        return by_name(self._own().read(deadline))

    # ----------------------------------------------------------------- writes
    def create(self, flow: flows_pb2.Flow, deadline: Deadline = NO_DEADLINE) -> flows_pb2.Flow:
        """Store a new flow.

        Raises:
            FlowFieldError: a field's value is refused (INVALID_ARGUMENT).
            FlowExistsError: the name is taken.
            FlowCycleError: the flow would close a replication cycle.
        """
        wanted = canonical(flow)
        for name in ("etag", "version", "create_time", "update_time"):
            wanted.ClearField(name)  # output only, ignored in requests
        config = to_config(wanted)
        check_aliases(config, self._clusters, self.store_alias)
        others = self._other_flows(deadline)
        result: list[flows_pb2.Flow] = []

        def change(flows: dict[str, flows_pb2.Flow]) -> Change:
            if config.name in flows:
                raise FlowExistsError(f"a flow named {config.name!r} already exists in cluster {self.store_alias!r}")
            self._check_cycle([*others, *(to_config(f) for f in flows.values())], config)
            stored = stamp(wanted, None, _now())
            result.append(stored)
            return config.name, stored

        self._own().write(change, deadline)
        return result[-1]

    def update(
        self,
        patch: flows_pb2.Flow,
        mask: field_mask_pb2.FieldMask,
        etag: str = "",
        deadline: Deadline = NO_DEADLINE,
    ) -> flows_pb2.Flow:
        """Change the masked fields of the flow patch.name (all fields for an empty mask).

        Raises:
            FlowNotFoundError: no such flow.
            StaleEtagError: etag is set and the flow changed since (ABORTED).
            FlowFieldError: a value is refused or an immutable field changes (INVALID_ARGUMENT).
            FlowNotLiveError: a field that cannot change live changes (FAILED_PRECONDITION).
            FlowCycleError: the change would close a replication cycle.
        """
        if not patch.name:
            raise FlowFieldError("flow.name", "the flow to update must be named")
        others = self._other_flows(deadline)
        result: list[flows_pb2.Flow] = []

        def change(flows: dict[str, flows_pb2.Flow]) -> Change:
            current = flows.get(patch.name)
            if current is None:
                raise FlowNotFoundError(f"no flow named {patch.name!r} in cluster {self.store_alias!r}")
            if etag and etag != current.etag:
                raise StaleEtagError(
                    f"flow {patch.name!r} changed since etag {etag!r} (now {current.etag!r}); read it again"
                )
            wanted = canonical(merged(current, patch, mask))
            before, after = to_config(current), to_config(wanted)
            check_change(before, after)
            check_aliases(after, self._clusters, self.store_alias)
            if same_definition(current, wanted):
                result.append(current)
                return None
            self._check_cycle([*others, *(to_config(f) for f in flows.values())], after)
            stored = stamp(wanted, current, _now())
            result.append(stored)
            return patch.name, stored

        self._own().write(change, deadline)
        return result[-1]

    def delete(self, name: str, etag: str = "", deadline: Deadline = NO_DEADLINE) -> None:
        """Delete the flow name.

        Raises:
            FlowNotFoundError: no such flow.
            StaleEtagError: etag is set and the flow changed since.
        """

        def change(flows: dict[str, flows_pb2.Flow]) -> Change:
            current = flows.get(name)
            if current is None:
                raise FlowNotFoundError(f"no flow named {name!r} in cluster {self.store_alias!r}")
            if etag and etag != current.etag:
                raise StaleEtagError(f"flow {name!r} changed since etag {etag!r} (now {current.etag!r}); read it again")
            return name, None

        self._own().write(change, deadline)

    def set_paused(self, name: str, paused: bool, deadline: Deadline = NO_DEADLINE) -> flows_pb2.Flow:
        """Pause or resume the flow name (idempotent).

        Raises:
            FlowNotFoundError: no such flow.
        """
        return self.update(
            flows_pb2.Flow(name=name, paused=paused), field_mask_pb2.FieldMask(paths=["paused"]), deadline=deadline
        )

    def seed(self, config: FlowConfig) -> flows_pb2.Flow:
        """The stored flow of config's name, storing config first when the store has none.

        A service started from the configuration file calls this: the store wins, a flow
        of the file reaches it only when it has none of that name.
        """
        # Restarts find the flow stored: a plain read, no write, so that dedupers of a flow starting
        # together do not fence one another's seeding.
        stored = self._own().read().get(config.name)
        if stored is not None:
            return stored
        wanted = to_proto(config)
        result: list[flows_pb2.Flow] = []

        def change(flows: dict[str, flows_pb2.Flow]) -> Change:
            if config.name in flows:
                result.append(flows[config.name])
                return None
            stored = stamp(wanted, None, _now())
            result.append(stored)
            return config.name, stored

        try:
            self._own().write(change)
        except FlowStoreBusyError:  # other writers won every attempt: another deduper seeded it, most likely
            stored = self._own().read().get(config.name)
            if stored is None:
                raise
            return stored
        return result[-1]

    # ----------------------------------------------------------------- cycles
    def _other_flows(self, deadline: Deadline) -> list[FlowConfig]:
        """The flows stored in the other clusters the server knows (those that have a store)."""
        out: list[FlowConfig] = []
        for alias, store in self._stores.items():
            if alias == self.store_alias or not store.exists(deadline):
                continue
            for flow in store.read(deadline).values():
                try:
                    out.append(to_config(flow))
                except FlowFieldError as exc:
                    _log.warning("flow %s in cluster %s ignored for the cycle check: %s", flow.name, alias, exc)
        return out

    @staticmethod
    def _check_cycle(flows: list[FlowConfig], new: FlowConfig) -> None:
        cycle = find_cycle(flows, new)
        if cycle is not None:
            raise FlowCycleError(
                f"flow {new.name!r} would close the replication cycle {describe(cycle)}, in which topics could "
                "come back; every flow on a cycle must use prefix naming without renames"
            )


def _now() -> timestamp_pb2.Timestamp:
    now = timestamp_pb2.Timestamp()
    now.GetCurrentTime()
    return now
