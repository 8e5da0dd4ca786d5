"""Replication cycles between cluster aliases, and the rule that keeps topics from coming back.

Flows are edges ``source -> target`` between cluster aliases. A topic replicated along a
cycle of flows could reach its own cluster again, and then be replicated once more, forever.
Ferryman adopts MirrorMaker 2's answer and refuses every other cycle:

- a flow with the **prefix** policy never replicates a source topic whose name, read as
  ``<alias><sep><alias><sep>...<topic>``, carries the target's alias in any position but the
  last (MM2's ``DefaultReplicationPolicy`` + ``isCycle``): ``A.orders`` is not copied back
  from ``B`` into ``A``, nor ``C.A.orders`` from ``C``. `TopicFilter` applies this;
- so a cycle is **allowed** when every flow on it uses the prefix policy with no renames
  (a rename can give a topic any name, the alias chain is lost), and **refused** otherwise:
  identity naming both ways between ``A`` and ``B`` would copy ``orders`` from ``A`` to ``B``
  and back as the same ``orders``.

A flow from a cluster to itself is the existing single-cluster rule of the configuration file
(identity naming without renames is refused there) and is not a cycle here.
"""

from __future__ import annotations

from collections.abc import Iterable

from ferryman.config import FlowConfig


def _safe(flow: FlowConfig) -> bool:
    """True when flow keeps topics from coming back along a cycle (prefix naming, no renames)."""
    return flow.naming.policy == "prefix" and not flow.naming.rename


def find_cycle(flows: Iterable[FlowConfig], new: FlowConfig) -> list[FlowConfig] | None:
    """A cycle that new closes among flows in which topics could come back, or None.

    The cycle is returned as the flows along it, new first; flows of the same name as new
    are left out (new replaces them).
    """
    if new.source == new.target:
        return None
    edges: dict[str, list[FlowConfig]] = {}
    for flow in flows:
        if flow.name != new.name and flow.source != flow.target:
            edges.setdefault(flow.source, []).append(flow)
    # Depth-first from new's target back to new's source: every path closes a cycle with new.
    stack: list[tuple[str, list[FlowConfig]]] = [(new.target, [new])]
    while stack:
        alias, path = stack.pop()
        if alias == new.source:
            if not all(_safe(f) for f in path):
                return path
            continue
        on_path = {f.target for f in path}
        for flow in edges.get(alias, []):
            if flow.target == new.source or flow.target not in on_path:
                stack.append((flow.target, [*path, flow]))
    return None


def describe(cycle: list[FlowConfig]) -> str:
    """``A -> B (flow x, identity) -> A (flow y, prefix+renames)``."""
    parts = [cycle[0].source]
    for flow in cycle:
        naming = flow.naming.policy + ("+renames" if flow.naming.rename else "")
        parts.append(f"{flow.target} (flow {flow.name}, {naming})")
    return " -> ".join(parts)
