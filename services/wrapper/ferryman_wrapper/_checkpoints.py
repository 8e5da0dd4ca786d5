"""Group checkpoints: the source consumer groups' committed offsets, sent to the dedupers to sync.

While a flow has ``sync_group_offsets`` on, every ``sync_group_offsets_interval_s`` this thread lists the
source's consumer groups, keeps those the flow's ``groups``/``groups_exclude`` choose (never Ferryman's own),
reads each one's committed offsets of the partitions this wrapper reads now (so the flow's wrappers split
the groups' partitions as they split the source's), and sends them on every control link. The dedupers
translate and commit them at the destination (``ferryman_deduper._group_sync``): MirrorMaker 2's
checkpoints and group-offset sync, over the control link instead of a checkpoints topic.

Groups are listed through the wrapper's source admin client (one per process, replaced when it alone stops
answering: ``ferryman.renewing_admin``) with the classic ``ListGroups`` call (``AdminClient.list_groups``),
not the Admin API's ``list_consumer_groups``: a broker restart during one of the latter can abort the
process in librdkafka 2.16 (docs/notes.md, Pitfalls, "Do not call coordinator Admin APIs"); the classic
call waits on a queue of its own and drops late answers. Offsets are read as ``GetGroupOffsets`` reads
them (``ferryman.group_offsets``: a consumer that never joins). A failed round is logged and retried at the
next interval: checkpoints are best-effort, and replication never depends on them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaException
from ferryman.config import FlowConfig
from ferryman.errors import FerrymanError, KafkaOperationError
from ferryman.group_offsets import Position, last_records_below, read_group_offsets
from ferryman.kafka_errors import is_transient
from ferryman.naming import GroupFilter
from ferryman.renewing_admin import RenewingAdmin
from ferryman.v1 import control_pb2

_log = logging.getLogger(__name__)

#: Longest a stop waits for the thread (it is a daemon: the drain never waits on a cluster away).
STOP_WAIT_S = 5.0

#: Longest one round's Kafka calls may take (listing, then each group's read).
ROUND_BUDGET_S = 30.0


def checkpoint(
    group: str, offsets: Mapping[Position, int], last: Mapping[Position, int]
) -> control_pb2.GroupCheckpoint:
    """One group's checkpoint message: its offsets by topic and partition, with the last records known."""
    return control_pb2.GroupCheckpoint(
        group=group,
        offsets=[
            control_pb2.GroupOffset(topic=t, partition=p, offset=o, last_record_offset=last.get((t, p)))
            for (t, p), o in sorted(offsets.items())
        ],
    )


class GroupCheckpointer:
    """Sends the chosen source groups' committed offsets to the dedupers, periodically (a thread of its own)."""

    def __init__(
        self,
        *,
        admin: RenewingAdmin,
        consumer_config: Callable[[], dict[str, Any]],
        flow: Callable[[], FlowConfig],
        wrapper_group: str,
        assigned: Callable[[], set[Position]],
        send: Callable[[control_pb2.ConnectRequest], None],
    ) -> None:
        """Read the source with consumer_config; report the partitions assigned() holds; send() to every link.

        Args:
            admin: The wrapper's source admin client (lists the groups).
            consumer_config: librdkafka properties of a source-cluster client (a new client per use).
            flow: The flow as it is now (sync switched on and off, groups changed, live).
            wrapper_group: The wrappers' own group at the source (never synced).
            assigned: The source partitions this wrapper reads now.
            send: Sends one message on every control link.
        """
        self._admin = admin
        self._consumer_config = consumer_config
        self._flow = flow
        self._wrapper_group = wrapper_group
        self._assigned = assigned
        self._send = send
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="group-checkpoints", daemon=True)
        #: Rounds sent, and groups in the last one (status and tests).
        self.rounds = 0
        self.last_groups: list[str] = []

    def start(self) -> None:
        """Start the thread (it idles while the flow does not sync group offsets)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; a round under way ends at its next Kafka call."""
        self._stop.set()
        self._thread.join(timeout=STOP_WAIT_S)

    def _run(self) -> None:
        while not self._stop.wait(self._flow().sync_group_offsets_interval_s):
            flow = self._flow()
            if not flow.sync_group_offsets:
                continue
            try:
                self.round(flow)
            except (KafkaException, FerrymanError) as exc:
                _log.warning(
                    "group checkpoints not sent this round (next in %.0f s): %s",
                    flow.sync_group_offsets_interval_s,
                    exc,
                )
            except Exception:
                _log.exception("group checkpoints failed; retried at the next interval")

    def round(self, flow: FlowConfig) -> control_pb2.GroupCheckpoints:
        """Read and send one round of checkpoints; returns what was sent.

        Raises:
            KafkaOperationError: the source did not answer the group listing within the round's budget.
        """
        deadline = time.monotonic() + ROUND_BUDGET_S
        assigned = self._assigned()
        topics = {topic for topic, _ in assigned}
        chosen = GroupFilter.of(flow, self._wrapper_group)
        groups = sorted(g for g in self._list_groups(ROUND_BUDGET_S) if chosen.matches(g))
        out = control_pb2.GroupCheckpoints()
        n = len(groups)
        for group in groups:
            if self._stop.is_set() or not assigned:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                _log.warning("group checkpoints: round budget spent after %d of %d groups", len(out.groups), n)
                break
            try:
                offsets = read_group_offsets(self._consumer_config(), group, topics.__contains__, left)
            except KafkaOperationError as exc:
                _log.info("group checkpoints: %s skipped this round: %s", group, exc)
                continue
            mine = {pos: offset for pos, offset in offsets.items() if pos in assigned}
            if mine:
                last = last_records_below(self._consumer_config(), mine, max(deadline - time.monotonic(), 0.1))
                out.groups.append(checkpoint(group, mine, last))
        if out.groups:
            self._send(control_pb2.ConnectRequest(group_checkpoints=out))
        self.rounds += 1
        self.last_groups = [g.group for g in out.groups]
        _log.debug("group checkpoints sent: %s", self.last_groups)
        return out

    def _list_groups(self, budget_s: float) -> list[str]:
        try:
            return [str(g.id) for g in self._admin.client.list_groups(timeout=budget_s) if g.id]
        except KafkaException as exc:
            if is_transient(exc):  # the source away, or the admin client stuck (then a new one is tried)
                self._admin.suspect()
            raise KafkaOperationError("listing the source's consumer groups", exc) from exc
