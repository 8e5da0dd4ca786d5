"""The ``Flow`` resource and `FlowConfig`: conversion both ways, validation, updates, etags.

Validation lives in one place: a ``Flow`` message is turned into the plain values of a YAML
flow and checked by `FlowConfig` itself (regexes, names, bounds), exactly as a flow of the
configuration file is; the API only adds what the file cannot know (aliases of the server's
clusters, fields that cannot change on a running flow).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping
from typing import Any

from google.protobuf import field_mask_pb2, timestamp_pb2

from ferryman.config import FlowConfig, validated
from ferryman.errors import ConfigError, FlowFieldError, FlowNotLiveError
from ferryman.v1 import flows_pb2

#: Config field names (as `validated` reports them) -> Flow message field names.
_PROTO_FIELD = {
    "source": "source_alias",
    "target": "target_alias",
    "naming.rename": "naming.renames",
    "topic_refresh_interval_s": "topic_refresh_interval_ms",
    "sync_group_offsets_interval_s": "sync_group_offsets_interval_ms",
}

#: Fields that identify a flow and its internal topics: never changed (INVALID_ARGUMENT).
IMMUTABLE_FIELDS = ("name", "source", "target", "staging_topic", "staging_partitions")

#: Fields running services cannot take over live (FAILED_PRECONDITION): delete and re-create the flow.
NOT_LIVE_FIELDS = (
    "exactly_once",
    "naming.policy",
    "naming.separator",
    "replicate_topic_configs",
    "emit_offset_mappings",
    "on_topic_recreated",
    "start_position",
)

#: Output-only fields of Flow: set by the store, ignored in requests, never in an update mask.
OUTPUT_ONLY = ("etag", "version", "create_time", "update_time")

_POLICY = {flows_pb2.NAMING_POLICY_PREFIX: "prefix", flows_pb2.NAMING_POLICY_IDENTITY: "identity"}
_START = {flows_pb2.START_POSITION_EARLIEST: "earliest", flows_pb2.START_POSITION_LATEST: "latest"}
_RECREATED = {flows_pb2.TOPIC_RECREATED_ACTION_RESET: "reset", flows_pb2.TOPIC_RECREATED_ACTION_HALT: "halt"}


def proto_field(config_path: str) -> str:
    """The Flow message's name for a config field path (``source`` -> ``source_alias``)."""
    for config_name, proto_name in _PROTO_FIELD.items():
        if config_path == config_name or config_path.startswith(config_name + "."):
            return proto_name + config_path[len(config_name) :]
    return config_path


def _flow_values(flow: flows_pb2.Flow) -> dict[str, Any]:
    """The plain values of a YAML flow for flow (unset fields left to FlowConfig's defaults)."""
    values: dict[str, Any] = {"name": flow.name, "source": flow.source_alias, "target": flow.target_alias}
    if flow.topics:
        values["topics"] = list(flow.topics)
    if flow.topics_exclude or flow.no_default_excludes:
        values["topics_exclude"] = list(flow.topics_exclude)
    naming: dict[str, Any] = {"rename": dict(flow.naming.renames)}
    if flow.naming.policy != flows_pb2.NAMING_POLICY_UNSPECIFIED:
        naming["policy"] = _POLICY.get(flow.naming.policy, str(flow.naming.policy))
    if flow.naming.separator:
        naming["separator"] = flow.naming.separator
    values["naming"] = naming
    for name in ("exactly_once", "replicate_topic_configs", "emit_offset_mappings"):
        if flow.HasField(name):
            values[name] = getattr(flow, name)
    if flow.replication_factor < 0:
        raise FlowFieldError("replication_factor", f"must be 0 (broker default) or more, not {flow.replication_factor}")
    values["replication_factor"] = flow.replication_factor or -1
    values["topic_configs_exclude"] = list(flow.topic_configs_exclude)
    if flow.topic_refresh_interval_ms:
        values["topic_refresh_interval_s"] = flow.topic_refresh_interval_ms / 1000
    values["paused"] = flow.paused
    if flow.staging_topic:
        values["staging_topic"] = flow.staging_topic
    if flow.staging_partitions:
        values["staging_partitions"] = flow.staging_partitions
    if flow.start_position != flows_pb2.START_POSITION_UNSPECIFIED:
        values["start_position"] = _START.get(flow.start_position, str(flow.start_position))
    if flow.on_topic_recreated != flows_pb2.TOPIC_RECREATED_ACTION_UNSPECIFIED:
        values["on_topic_recreated"] = _RECREATED.get(flow.on_topic_recreated, str(flow.on_topic_recreated))
    values["sync_group_offsets"] = flow.sync_group_offsets
    if flow.groups:
        values["groups"] = list(flow.groups)
    if flow.groups_exclude or flow.no_default_groups_exclude:
        values["groups_exclude"] = list(flow.groups_exclude)
    if flow.sync_group_offsets_interval_ms:
        values["sync_group_offsets_interval_s"] = flow.sync_group_offsets_interval_ms / 1000
    return values


def to_config(flow: flows_pb2.Flow) -> FlowConfig:
    """The `FlowConfig` of flow, checked as a flow of the configuration file is.

    Raises:
        FlowFieldError: a field's value is refused; its ``field`` is the Flow field.
    """
    try:
        return validated(FlowConfig, _flow_values(flow))
    except ConfigError as exc:
        path, _, problem = str(exc).partition(": ")
        raise FlowFieldError(proto_field(path), problem or str(exc)) from exc


def to_proto(config: FlowConfig) -> flows_pb2.Flow:
    """The Flow message of config (output-only fields unset); topics_exclude is always explicit."""
    refresh_ms = round(config.topic_refresh_interval_s * 1000) if config.topic_refresh_interval_s else 0
    return flows_pb2.Flow(
        name=config.name,
        source_alias=config.source,
        target_alias=config.target,
        topics=config.topics,
        topics_exclude=config.topics_exclude,
        no_default_excludes=not config.topics_exclude,
        naming=flows_pb2.Naming(
            policy={v: k for k, v in _POLICY.items()}[config.naming.policy],
            separator=config.naming.separator,
            renames=config.naming.rename,
        ),
        exactly_once=config.exactly_once,
        replication_factor=max(config.replication_factor, 0),
        topic_configs_exclude=config.topic_configs_exclude,
        replicate_topic_configs=config.replicate_topic_configs,
        topic_refresh_interval_ms=refresh_ms,
        paused=config.paused,
        staging_topic=config.staging_topic or "",
        staging_partitions=config.staging_partitions,
        start_position={v: k for k, v in _START.items()}[config.start_position],
        emit_offset_mappings=config.emit_offset_mappings,
        on_topic_recreated={v: k for k, v in _RECREATED.items()}[config.on_topic_recreated],
        sync_group_offsets=config.sync_group_offsets,
        groups=config.groups,
        groups_exclude=config.groups_exclude,
        no_default_groups_exclude=not config.groups_exclude,
        sync_group_offsets_interval_ms=round(config.sync_group_offsets_interval_s * 1000),
    )


def canonical(flow: flows_pb2.Flow) -> flows_pb2.Flow:
    """Flow validated and with every default spelled out, output-only fields kept.

    Raises:
        FlowFieldError: a field's value is refused.
    """
    out = to_proto(to_config(flow))
    out.etag, out.version = flow.etag, flow.version
    if flow.HasField("create_time"):
        out.create_time.CopyFrom(flow.create_time)
    if flow.HasField("update_time"):
        out.update_time.CopyFrom(flow.update_time)
    return out


def same_definition(a: flows_pb2.Flow, b: flows_pb2.Flow) -> bool:
    """True when a and b define the same flow (output-only fields aside)."""
    return to_config(a) == to_config(b)


def check_aliases(config: FlowConfig, clusters: Collection[str], store_alias: str) -> None:
    """Refuse aliases the server does not know, and a target other than the cluster holding the store.

    Raises:
        FlowFieldError: naming ``source_alias`` or ``target_alias``.
    """
    for field_name, alias in (("source_alias", config.source), ("target_alias", config.target)):
        if alias not in clusters:
            raise FlowFieldError(field_name, f"unknown cluster alias {alias!r} (known: {', '.join(sorted(clusters))})")
    if config.source == config.target and config.naming.policy == "identity" and not config.naming.rename:
        raise FlowFieldError("naming.policy", "identity naming onto the same cluster would loop")
    if config.target != store_alias:
        raise FlowFieldError(
            "target_alias",
            f"this server stores the flows of cluster {store_alias!r}; a flow into {config.target!r} is "
            f"created through a deduper whose destination is {config.target!r}",
        )


def etag_of(flow: flows_pb2.Flow) -> str:
    """An etag for flow: a digest of everything stored but the etag itself."""
    body = flows_pb2.Flow()
    body.CopyFrom(flow)
    body.etag = ""
    return hashlib.sha256(body.SerializeToString(deterministic=True)).hexdigest()[:16]


def stamp(flow: flows_pb2.Flow, previous: flows_pb2.Flow | None, now: timestamp_pb2.Timestamp) -> flows_pb2.Flow:
    """Flow with its output-only fields set for a write after previous (None: a creation)."""
    out = flows_pb2.Flow()
    out.CopyFrom(flow)
    out.create_time.CopyFrom(previous.create_time if previous is not None else now)
    out.update_time.CopyFrom(now)
    out.version = (previous.version if previous is not None else 0) + 1
    out.etag = etag_of(out)
    return out


def _changed(before: FlowConfig, after: FlowConfig, path: str) -> bool:
    a: Any = before
    b: Any = after
    for part in path.split("."):
        a, b = getattr(a, part), getattr(b, part)
    return bool(a != b)


def check_change(before: FlowConfig, after: FlowConfig) -> None:
    """Refuse a change of an immutable field or of one that cannot change live.

    Raises:
        FlowFieldError: an immutable field changed (INVALID_ARGUMENT).
        FlowNotLiveError: a field running services cannot take over changed (FAILED_PRECONDITION).
    """
    for path in IMMUTABLE_FIELDS:
        if _changed(before, after, path):
            raise FlowFieldError(proto_field(path), "is immutable; create a new flow instead")
    for path in NOT_LIVE_FIELDS:
        if _changed(before, after, path):
            raise FlowNotLiveError(
                proto_field(path), "cannot change on a running flow; delete the flow and create it again"
            )


_MASK_ROOTS = frozenset(f.name for f in flows_pb2.Flow.DESCRIPTOR.fields)


def merged(current: flows_pb2.Flow, patch: flows_pb2.Flow, mask: field_mask_pb2.FieldMask) -> flows_pb2.Flow:
    """Current with the masked fields taken from patch; an empty mask replaces every field.

    Raises:
        FlowFieldError: naming ``update_mask`` for an unknown or output-only path.
    """
    for path in mask.paths:
        root = path.split(".", 1)[0]
        if root not in _MASK_ROOTS or not re.fullmatch(r"[a-z_]+(\.[a-z_]+)?", path):
            raise FlowFieldError("update_mask", f"unknown field path {path!r}")
        if root in OUTPUT_ONLY:
            raise FlowFieldError("update_mask", f"{path!r} is output only")
    if not mask.paths:
        out = flows_pb2.Flow()
        out.CopyFrom(patch)
        for name in OUTPUT_ONLY:
            out.ClearField(name)  # type: ignore[arg-type]  # names of Flow's fields
        return out
    if not mask.IsValidForDescriptor(flows_pb2.Flow.DESCRIPTOR):
        raise FlowFieldError("update_mask", f"invalid paths {list(mask.paths)}")
    out = flows_pb2.Flow()
    out.CopyFrom(current)
    mask.MergeMessage(patch, out, replace_message_field=True, replace_repeated_field=True)
    for listed, flag in (("topics_exclude", "no_default_excludes"), ("groups_exclude", "no_default_groups_exclude")):
        if listed in mask.paths and not getattr(patch, listed) and flag not in mask.paths:
            setattr(out, flag, getattr(patch, flag))
    return out


def by_name(flows: Mapping[str, flows_pb2.Flow]) -> list[flows_pb2.Flow]:
    """Flows ordered by name."""
    return [flows[k] for k in sorted(flows)]
