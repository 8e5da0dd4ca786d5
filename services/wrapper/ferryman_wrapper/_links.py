"""The wrapper's end of its control links: the dedupers it talks to, what it tells them, what they ask.

One ``ControlLink`` (``_control``) per deduper, listed in
``wrapper.deduper_addresses`` or found in the destination cluster
(``_discovery``); one ``ResendWorker`` answers their resend requests. The
links are told the Hello, the topic specs whenever they change and the
progress of each assigned partition; they tell the deduper's backpressure and
committed watermarks. Source reads are paused here, on the loop thread, as the
deduper asks, while the flow is paused or deleted, or while staging is
unreachable. Exactly-once never depends on these links: the data path fails
open when they are down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, TopicPartition
from ferryman import protocol
from ferryman.client_config import base_config
from ferryman.config import ClusterConfig, FlowConfig, RpcConfig, WrapperConfig
from ferryman.health import ClusterHealth
from ferryman.naming import FlowNames
from ferryman.state import PartitionKey
from ferryman.tracing import Tracing
from ferryman.v1 import control_pb2, state_pb2

from ferryman_wrapper._assignment import SourcePartitions
from ferryman_wrapper._control import RESEND_READ_BUDGET_S, ControlLink, ResendWorker
from ferryman_wrapper._discovery import DeduperDiscovery
from ferryman_wrapper._specs import SpecPublisher

_log = logging.getLogger(__name__)


class DeduperLinks:
    """The control links to the flow's dedupers, and the pause of source reads they ask for."""

    def __init__(
        self,
        *,
        source: ClusterConfig,
        target: ClusterConfig,
        wc: WrapperConfig,
        rpc: RpcConfig,
        names: FlowNames,
        wrapper_id: str,
        flow: Callable[[], FlowConfig],
        cluster_id: Callable[[], str],
        parts: SourcePartitions,
        specs: Callable[[], SpecPublisher],
        consumer: Callable[[], Consumer],
        target_health: ClusterHealth,
        tracing: Tracing | None,
    ) -> None:
        """Prepare (no link is started before start()).

        Args:
            source: the source cluster (the resend worker reads it).
            target: the destination cluster (the discovery reads its dedupers topic).
            wc: the wrapper's settings (deduper addresses, discovery, envelope limits).
            rpc: gRPC settings of the links.
            names: the flow's names (wrapper group, dedupers topic).
            wrapper_id: this process's identity (Hello, resent envelopes).
            flow: the flow as it is now (the store may change it).
            cluster_id: the source cluster's id (after start-up).
            parts: the assigned source partitions (epoch, chain).
            specs: the topic spec publisher (the specs sent, their changes).
            consumer: the current source consumer (paused and resumed, its log end offsets).
            target_health: the staging cluster's health (reads are paused while it is unreachable).
            tracing: the process's tracing (None: off).
        """
        self._source = source
        self._target = target
        self._wc = wc
        self._rpc = rpc
        self._names = names
        self._wrapper_id = wrapper_id
        self._flow = flow
        self._cluster_id = cluster_id
        self._parts = parts
        self._specs = specs
        self._consumer = consumer
        self._target_health = target_health
        self._tracing = tracing
        self.pause_wanted: tuple[bool, str] = (False, "")
        self.paused = False
        self.watermarks: dict[PartitionKey, control_pb2.PartitionWatermark] = {}
        self.links: list[ControlLink] = []
        #: Finds the dedupers in the destination cluster when deduper_addresses is empty.
        self._finder: DeduperDiscovery | None = None
        self.progress_snapshot: list[control_pb2.PartitionProgress] = []
        self.resender: ResendWorker

    def start(self) -> None:
        """Start the resend worker, a link per listed deduper (or the discovery), and send spec changes."""
        self.resender = ResendWorker(
            consumer_config={
                **base_config(self._source, f"{self._wrapper_id}-resend"),
                "group.id": f"{self._names.wrapper_group}.resend",
            },
            wrapper_id=self._wrapper_id,
            max_records=self._wc.envelope_max_records,
            max_bytes=self._wc.envelope_max_bytes,
            read_budget_s=RESEND_READ_BUDGET_S,
            tracing=self._tracing,
            consumer_group=self._names.wrapper_group,
            topic_id=lambda t: spec.topic_id if (spec := self._specs().published.get(t)) is not None else None,
        )
        self.resender.start()
        for address in self._wc.deduper_addresses:
            link = self._new_link(address)
            link.start()
            self.links.append(link)
        if not self._wc.deduper_addresses and self._wc.discover_dedupers:
            self._finder = DeduperDiscovery(
                names=self._names,
                consumer_config=base_config(self._target, f"{self._wrapper_id}-discovery"),
                make_link=self._new_link,
                links=self.links,
            )
            self._finder.start()
        self._specs().on_change = self._send_specs

    def stop(self) -> None:
        """Stop the discovery, the links and the resend worker, in that order."""
        if self._finder is not None:
            self._finder.stop()  # first: it would start links to dedupers it finds meanwhile
        for link in self.links:
            link.stop()
        if self.links or self._finder is not None:
            self.resender.stop()

    def _new_link(self, address: str) -> ControlLink:
        return ControlLink(
            address=address,
            rpc=self._rpc,
            hello=self._hello,
            specs=lambda: list(self._specs().published.values()),
            on_backpressure=self._on_backpressure,
            on_resend=self.resender.submit,
            on_watermarks=self._on_watermarks,
            tracer_provider=self._tracing.provider if self._tracing is not None else None,
        )

    def _hello(self) -> control_pb2.Hello:
        return control_pb2.Hello(
            version=protocol.current_version(),
            wrapper_id=self._wrapper_id,
            epoch=self._parts.last_epoch,
            flow=self._flow().name,
            source_cluster_id=self._cluster_id(),
        )

    def _send_specs(self, specs: list[state_pb2.TopicSpec]) -> None:
        self.broadcast(control_pb2.ConnectRequest(topic_specs=control_pb2.TopicSpecs(specs=specs)))

    def broadcast(self, msg: control_pb2.ConnectRequest) -> None:
        """Send msg on every link (any thread; a link that is down drops it)."""
        for link in list(self.links):
            link.send(msg)

    def assigned(self) -> set[tuple[str, int]]:
        """The source partitions of the last progress report (any thread): those this wrapper reads."""
        return {(p.topic, p.partition) for p in self.progress_snapshot}

    def _on_backpressure(self, paused: bool, reason: str) -> None:
        self.pause_wanted = (paused, reason)

    def _on_watermarks(self, watermarks: control_pb2.Watermarks) -> None:
        for w in watermarks.partitions:
            self.watermarks[PartitionKey(w.topic, w.partition)] = w

    def apply_backpressure(self, *, flow_idle: bool) -> None:
        """Pause or resume reading the source as the deduper asked, or while staging is unreachable (loop thread).

        Paused partitions keep the consumer polled (group membership, callbacks)
        while nothing more is read for a producer that cannot deliver. flow_idle:
        the flow is deleted (reads are paused as for a paused flow).
        """
        paused, reason = self.pause_wanted
        flow = self._flow()
        if flow.paused or flow_idle:
            paused, reason = True, f"flow {flow.name} {'deleted' if flow_idle else 'paused'}"
        elif not self._target_health.reachable:
            paused, reason = True, f"{self._target_health.name} unreachable"
        if paused == self.paused:
            return
        consumer = self._consumer()
        assignment = consumer.assignment()
        if paused:
            consumer.pause(assignment)
            _log.warning("pausing source reads: %s", reason)
        else:
            consumer.resume(assignment)
            _log.info("resuming source reads (%s)", reason)
        self.paused = paused

    def _progress(self) -> list[control_pb2.PartitionProgress]:
        out = []
        chain = self._parts.chain
        consumer = self._consumer()
        for key in sorted(chain):
            try:
                _low, high = consumer.get_watermark_offsets(TopicPartition(key.topic, key.partition), cached=True)
            except KafkaException:
                high = -1
            out.append(
                control_pb2.PartitionProgress(
                    topic=key.topic, partition=key.partition, log_end_offset=high, last_wrapped_offset=chain[key]
                )
            )
        return out

    def send_progress(self) -> None:
        """Send every link the progress of each assigned partition (loop thread)."""
        self.progress_snapshot = self._progress()
        self.broadcast(control_pb2.ConnectRequest(progress=control_pb2.Progress(partitions=self.progress_snapshot)))
