"""Names: destination topics (the replication policy), internal topics, ids.

Every name Ferryman derives lives here, so the wrapper, the deduper, the admin
API and the tests agree on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ferryman.config import FlowConfig, NamingConfig


@dataclass(frozen=True)
class NamingPolicy:
    """Maps a source topic name to its destination topic name.

    Explicit renames win; otherwise ``prefix`` gives ``<alias><sep><topic>``
    (MirrorMaker 2's DefaultReplicationPolicy) and ``identity`` keeps the name.
    """

    source_alias: str
    config: NamingConfig

    def destination_topic(self, source_topic: str) -> str:
        """Return the destination topic for source_topic."""
        if source_topic in self.config.rename:
            return self.config.rename[source_topic]
        if self.config.policy == "identity":
            return source_topic
        return f"{self.source_alias}{self.config.separator}{source_topic}"


@dataclass(frozen=True)
class TopicFilter:
    """Selects source topics by full-match include and exclude regexes."""

    include: tuple[re.Pattern[str], ...]
    exclude: tuple[re.Pattern[str], ...]
    came_from: tuple[str, str] | None = None
    """(target alias, separator) of a prefix-policy flow: topics whose alias chain names the
    target came from there and are never replicated back (MirrorMaker 2's cycle rule)."""

    @classmethod
    def of(cls, flow: FlowConfig) -> TopicFilter:
        """Build the filter of a flow."""
        prefix = flow.naming.policy == "prefix" and flow.source != flow.target and bool(flow.naming.separator)
        return cls(
            include=tuple(re.compile(p) for p in flow.topics),
            exclude=tuple(re.compile(p) for p in flow.topics_exclude),
            came_from=(flow.target, flow.naming.separator) if prefix else None,
        )

    def matches(self, topic: str) -> bool:
        """True when topic is included, not excluded, and did not come from the flow's target."""
        if self.came_from is not None and self.came_from[0] in topic.split(self.came_from[1])[:-1]:
            return False
        return any(p.fullmatch(topic) for p in self.include) and not any(p.fullmatch(topic) for p in self.exclude)


#: Consumer groups of Ferryman's own clients start so; they are never synced.
OWN_GROUP_PREFIXES = ("ferryman-", "ferryman.")


@dataclass(frozen=True)
class GroupFilter:
    """Selects the consumer groups whose offsets a flow syncs (full-match include and exclude regexes)."""

    include: tuple[re.Pattern[str], ...]
    exclude: tuple[re.Pattern[str], ...]
    own: tuple[str, ...] = OWN_GROUP_PREFIXES
    """Prefixes of groups never synced: Ferryman's own (the wrapper's group may be renamed by config)."""

    @classmethod
    def of(cls, flow: FlowConfig, wrapper_group: str = "") -> GroupFilter:
        """Build the filter of a flow whose wrappers read the source as wrapper_group."""
        return cls(
            include=tuple(re.compile(p) for p in flow.groups),
            exclude=tuple(re.compile(p) for p in flow.groups_exclude),
            own=OWN_GROUP_PREFIXES + ((wrapper_group,) if wrapper_group else ()),
        )

    def matches(self, group: str) -> bool:
        """True when group is included, not excluded, and not one of Ferryman's own."""
        if not group or group.startswith(self.own):
            return False
        return any(p.fullmatch(group) for p in self.include) and not any(p.fullmatch(group) for p in self.exclude)


@dataclass(frozen=True)
class FlowNames:
    """Internal topic names and client ids of one flow.

    Internal topics end in ``.internal`` so the default exclude list keeps a
    flow from replicating another flow's internals.
    """

    flow: str
    staging_topic: str
    state_topic: str
    specs_topic: str
    offset_map_topic: str
    audit_topic: str
    dedupers_topic: str
    """Compacted: each live deduper's advertised address, keyed by instance id (wrappers find them there)."""
    dlq_topic: str
    """Dead letters: staging records the deduper quarantined, with the reason and staging coordinates in headers."""
    wrapper_group: str
    deduper_group: str

    @classmethod
    def of(cls, flow: FlowConfig, *, wrapper_group: str | None = None, deduper_group: str | None = None) -> FlowNames:
        """Derive the names of a flow (group ids may be overridden by config)."""
        base = f"ferryman.{flow.name}"
        return cls(
            flow=flow.name,
            staging_topic=flow.staging_topic or f"{base}.staging.internal",
            state_topic=f"{base}.state.internal",
            specs_topic=f"{base}.topics.internal",
            offset_map_topic=f"{base}.offset-map.internal",
            audit_topic=f"{base}.audit.internal",
            dedupers_topic=f"{base}.dedupers.internal",
            dlq_topic=f"{base}.dlq.internal",
            wrapper_group=wrapper_group or f"ferryman-wrapper.{flow.name}",
            deduper_group=deduper_group or f"ferryman-deduper.{flow.name}",
        )

    def transactional_id(self, instance_id: str) -> str:
        """transactional.id of the deduper instance instance_id."""
        return f"ferryman-deduper.{self.flow}.{instance_id}"


#: Compacted topic of the destination cluster holding its replication flows (key: flow name,
#: value: a serialized ``ferryman.v1.Flow``, tombstone: deleted).
FLOWS_TOPIC = "ferryman.flows.internal"

#: The one transactional.id of every writer of a cluster's flow store: a writer that starts a
#: write fences any other, which makes the read-check-write of each change linearizable.
FLOWS_STORE_TRANSACTIONAL_ID = "ferryman-flows-store"
