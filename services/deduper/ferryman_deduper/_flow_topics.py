"""The flow's internal topics under a running deduper: made at start-up, watched, made again or mourned.

A topic deleted under the flow fails every transaction that writes it, so the deduper asks which are gone
(`TopicWatch`, off the loop) and acts on the answer here:

* the **state topic** gone or made again: never restored from (an empty state is watermark -1 everywhere,
  so every record still in the source would be written again); the flow stalls for good, naming it;
* the **staging topic** made again (by a wrapper): the deduper reads the new one from its start;
* the **offset-map, dead-letter and dedupers topics** (an index, a quarantine, heartbeats; no watermarks):
  made again, and they go on from there.

Destination topics are `DestinationTopics`' (``forget_vanished``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import NamedTuple

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from ferryman import topics
from ferryman.advertisement import dedupers_topic
from ferryman.config import FlowConfig
from ferryman.errors import FerrymanError
from ferryman.naming import FlowNames
from ferryman.renewing_admin import RenewingAdmin
from ferryman.state import COMPACTED_TOPIC_CONFIGS
from ferryman.topics import InternalTopic

from ferryman_deduper._quarantine import DLQ_HEADER_ROOM_BYTES
from ferryman_deduper._topic_watch import Found, TopicWatch

_log = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 30.0
#: Internal topics made again when deleted under the flow (see the module docstring).
_REMAKEABLE = ("offset-map", "dead-letter", "dedupers")


class Followed(NamedTuple):
    """What one answer of the watch showed (`FlowTopics.follow`)."""

    found: Found
    #: The staging topic was made again: the deduper reads the new one from its start.
    staging_remade: bool


class FlowTopics:
    """The deduper's internal topics of one flow, and the ids of the staging and state topics it reads."""

    def __init__(
        self, names: FlowNames, flow: FlowConfig, *, staging_max_message_bytes: int, startup_timeout_s: float
    ) -> None:
        self._names = names
        self._flow = flow
        self._staging_max_message_bytes = staging_max_message_bytes
        self._startup_timeout_s = startup_timeout_s
        self._admin: RenewingAdmin | None = None
        self._watch: TopicWatch | None = None
        self._staging_id: bytes | None = None
        self._state_id: bytes | None = None
        #: Why the flow stalls for good: the state topic is gone ("" while it is there).
        self.state_lost = ""

    def internal(self) -> list[InternalTopic]:
        """The internal topics the deduper makes at start-up (shapes checked there)."""
        n = self._flow.staging_partitions
        staging_configs = {"cleanup.policy": "delete", "max.message.bytes": str(self._staging_max_message_bytes)}
        wanted = [
            InternalTopic(
                self._names.staging_topic, n, staging_configs, "staging", f"flows[{self._flow.name}].staging_partitions"
            ),
            InternalTopic(self._names.state_topic, n, COMPACTED_TOPIC_CONFIGS, "state"),
            InternalTopic(self._names.specs_topic, 1, COMPACTED_TOPIC_CONFIGS, "topic-spec"),
        ]
        # Dead letters keep the original bytes of a staging record plus a few headers.
        dlq_configs = {
            "cleanup.policy": "delete",
            "max.message.bytes": str(self._staging_max_message_bytes + DLQ_HEADER_ROOM_BYTES),
        }
        wanted.append(InternalTopic(self._names.dlq_topic, n, dlq_configs, "dead-letter"))
        if self._flow.emit_offset_mappings:
            wanted.append(InternalTopic(self._names.offset_map_topic, n, COMPACTED_TOPIC_CONFIGS, "offset-map"))
        wanted.append(dedupers_topic(self._names))  # where the Advertiser writes
        return wanted

    def ensure(self, admin: AdminClient) -> None:
        """Start-up: make the internal topics (or check the shapes of those there)."""
        topics.ensure_internal_topics(admin, self.internal(), ADMIN_TIMEOUT_S, visible_budget_s=self._startup_timeout_s)

    @property
    def staging_id(self) -> bytes | None:
        """The id of the staging topic read now (None before ``read_ids``)."""
        return self._staging_id

    def read_ids(self, admin: RenewingAdmin) -> None:
        """Start-up, once the topics are there: the ids of the staging and state topics this deduper reads."""
        staging, state = self._names.staging_topic, self._names.state_topic
        ids = topics.describe_topics(admin.client, [staging, state], ADMIN_TIMEOUT_S)
        self._staging_id, self._state_id = ids[staging].topic_id, ids[state].topic_id
        self._admin = admin
        self._watch = TopicWatch(admin)

    # ------------------------------------------------------------ the watch
    def watch_periodically(self) -> None:
        """The sync's question: the staging topic made again by a wrapper, the state and dedupers topics."""
        self._ask([self._names.staging_topic, self._names.state_topic, self._names.dedupers_topic])

    def watch_after_failed_transaction(self, destinations: Collection[str]) -> None:
        """Topics deleted under the flow fail every transaction that writes them: which are gone?"""
        self._ask([*destinations, *self._remakeable()])

    def watch_state(self) -> None:
        """A rewind that cannot read the state topic: is it gone? (answered on a later attempt)."""
        self._ask([self._names.state_topic])

    def _ask(self, names: Collection[str]) -> None:
        assert self._watch is not None
        self._watch.ask(names)

    def follow(self) -> Followed | None:
        """Take the watch's answer, if it has come: note the state topic lost, the staging topic made again.

        Returns:
            None while nothing is answered. Once the state topic is lost (`state_lost`) nothing else is acted on.
        """
        assert self._watch is not None
        found = self._watch.answers()
        if not found:
            return None
        self._follow_state(found)
        return Followed(found, staging_remade=not self.state_lost and self._follow_staging(found))

    def state_is_original(self) -> bool:
        """Whether the state topic a restore just read is the one this deduper started on (blocking: restores only).

        A state topic deleted and made again (by hand, or by a tool that keeps topics as declared) reads as
        empty: restored from, every watermark would be -1 and every record still in the source written
        again. The watch notices it within a sync; a restore in between would not. Described before the read
        (a deleted topic is named at once) and after it: the same id then proves the read came from the
        original topic (a topic made again has a new one).

        Raises:
            KafkaException: the describe failed (the restore is tried again).
        """
        if self._admin is None:  # start-up: the ids are read after the topics are made
            return True
        state = self._names.state_topic
        found = topics.describe_topics(self._admin.client, [state], ADMIN_TIMEOUT_S)
        self._follow_state({state: found.get(state)})
        return not self.state_lost

    def _follow_state(self, found: Found) -> None:
        """Notice the state topic deleted (or made again) under the flow: stall, naming it, never restore from it.

        The flow stalls with this reason (NOT_SERVING, status) until an operator acts; a restart meets the
        start-up guard (destination topics holding records the state does not name).
        """
        state = self._names.state_topic
        if self.state_lost or state not in found:
            return
        info = found[state]
        if info is not None and info.topic_id == self._state_id:
            return
        self.state_lost = (
            f"state topic {state} was {'deleted' if info is None else 'deleted and made again'} under the running "
            "flow: nothing more is written (restored from an empty state, every record still in the source would be "
            "written again). To go on: stop the flow's dedupers, delete its destination topics and its state topic, "
            "and start them again: the source is copied again from its earliest records"
        )
        _log.error("%s", self.state_lost)

    def _follow_staging(self, found: Found) -> bool:
        """Whether the staging topic was deleted and made again (by a wrapper): the new one is read from its start.

        A topic that is gone now is left to the wrappers, which make it again when their writes fail.
        """
        info = found.get(self._names.staging_topic)
        if info is None or info.topic_id == self._staging_id:
            return False
        _log.error(
            "staging topic %s was deleted and made again under the running flow: reading the new one from its "
            "start (envelopes lost with the old one are asked for again from the wrappers)",
            info.name,
        )
        self._staging_id = info.topic_id
        return True

    # ------------------------------------------------------- made again
    def _remakeable(self) -> list[str]:
        return [t.name for t in self.internal() if t.purpose in _REMAKEABLE]

    def make_again_if_deleted(self, found: Found) -> None:
        """Make the offset-map, dead-letter and dedupers topics again that the watch found deleted."""
        assert self._admin is not None
        deleted = {name for name in self._remakeable() if name in found and found[name] is None}
        if not deleted:
            return
        wanted = [t for t in self.internal() if t.name in deleted]
        try:
            made = topics.ensure_internal_topics(
                self._admin.client, wanted, ADMIN_TIMEOUT_S, visible_budget_s=self._startup_timeout_s
            )
        except (KafkaException, FerrymanError) as exc:  # asked again after the next failed transaction
            _log.warning("internal topics %s are gone and could not be made again yet: %s", sorted(deleted), exc)
            return
        if made:
            _log.error(
                "internal topics %s were deleted under the running flow: making them again (what they held is gone)",
                ", ".join(made),
            )
