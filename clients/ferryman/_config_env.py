"""Environment overrides of the configuration: ``FERRYMAN_<SECTION>__<FIELD>[__<FIELD>...]=<value>``.

The variable's path is walked through the configuration model's types, so each value is
parsed as the field it sets needs, here at the edge and nowhere else:

- a scalar field (string, number, boolean, path, secret) takes the value as it is; the
  model's validation converts it (``"50"`` to 50, ``"true"`` to True);
- a list field takes a comma-separated string (``a:1,b:2``; ``""`` is the empty list) or a
  YAML/JSON flow sequence (``[a:1, b:2]``, ``["a{1,3}"]`` for items holding commas);
- a map or section field takes a YAML/JSON mapping (``{security.protocol: SSL}``), which
  replaces the field as a whole;
- a path part naming a key of a map (a cluster alias) or an index of a list (``FLOWS__0``)
  goes inside it; under ``client_config``, whose keys are librdkafka property names, ``_``
  stands for ``.`` (``FERRYMAN_CLUSTERS__SRC__CLIENT_CONFIG__SASL_USERNAME`` sets
  ``sasl.username``).

Variables are applied in name order, so a whole map is set before the variables that set
single keys of it. A value that does not parse is refused naming the variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec.inspect as mi
import yaml

from ferryman.errors import ConfigError

PREFIX = "FERRYMAN_"

#: Map fields whose keys are librdkafka property names (dotted, never underscored).
_DOTTED_KEY_FIELDS = frozenset({"client_config"})


def apply_env_overrides(data: dict[str, Any], env: Mapping[str, str], model: type) -> None:
    """Set the fields the ``FERRYMAN_*__*`` variables of env name in data (plain values).

    Args:
        data: the configuration as plain values (as YAML gives it); changed in place.
        env: the environment to read.
        model: the configuration model data describes (its field types say how to parse).

    Raises:
        ConfigError: naming the variable whose path or value does not fit the model.
    """
    root = mi.type_info(model)
    for name, value in sorted(env.items()):
        if not name.startswith(PREFIX) or "__" not in name:
            continue
        _apply_one(data, root, name, [p.lower() for p in name[len(PREFIX) :].split("__")], value)


def _apply_one(data: dict[str, Any], root: mi.Type, name: str, path: list[str], value: str) -> None:
    node: dict[str, Any] | list[Any] = data
    kind: mi.Type | None = root
    parent_field = ""
    for depth, part in enumerate(path):
        last = depth == len(path) - 1
        kind = _unwrap(kind)
        key: str | int
        if isinstance(node, list):
            if not part.isdigit():
                raise ConfigError(f"{name}: {'.'.join(path[:depth])} is a list; {part!r} is not an index")
            key = int(part)
            if key > len(node):
                raise ConfigError(
                    f"{name}: index {key} is past the end of {'.'.join(path[:depth])} ({len(node)} items)"
                )
            if key == len(node):
                node.append({})
            child_kind = kind.item_type if isinstance(kind, mi.ListType) else None
        else:
            key = part.replace("_", ".") if parent_field in _DOTTED_KEY_FIELDS else part
            child_kind = _child_type(kind, part)
        if last:
            _store(node, key, _parse(name, value, _unwrap(child_kind)))
            return
        if isinstance(node, list):
            child = node[int(key)]
        else:
            child = node.setdefault(str(key), [] if _is_list(child_kind) else {})
        if not isinstance(child, dict | list):
            raise ConfigError(f"{name}: {'.'.join(path[: depth + 1])} is not a section")
        node, kind, parent_field = child, child_kind, part


def _store(node: dict[str, Any] | list[Any], key: str | int, value: object) -> None:
    if isinstance(node, list):
        assert isinstance(key, int)  # _apply_one indexes lists with numbers only
        node[key] = value
    else:
        node[str(key)] = value


def _unwrap(kind: mi.Type | None) -> mi.Type | None:
    """The one non-None member of an optional type (``str | None`` is parsed as ``str``)."""
    if isinstance(kind, mi.UnionType):
        members = [t for t in kind.types if not isinstance(t, mi.NoneType)]
        return members[0] if len(members) == 1 else kind
    return kind


def _child_type(kind: mi.Type | None, part: str) -> mi.Type | None:
    """The type of part inside kind; None when unknown (validation then names the field)."""
    if isinstance(kind, mi.StructType):
        return next((f.type for f in kind.fields if f.name == part), None)
    if isinstance(kind, mi.DictType):
        return kind.value_type
    return None


def _is_list(kind: mi.Type | None) -> bool:
    return isinstance(_unwrap(kind), mi.ListType)


def _parse(name: str, value: str, kind: mi.Type | None) -> object:
    """The value as the field of type kind needs it; scalars are left for validation to convert."""
    if isinstance(kind, mi.ListType):
        text = value.strip()
        if text.startswith("["):
            return _yaml(name, text, list, "a sequence ([a, b])")
        return [item.strip() for item in text.split(",") if item.strip()]
    if isinstance(kind, mi.DictType | mi.StructType):
        return _yaml(name, value, dict, "a mapping ({key: value})")
    return value


def _yaml(name: str, text: str, expected: type, what: str) -> object:
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = str(exc).replace("\n", " ")
        raise ConfigError(f"{name}: expected {what} in YAML/JSON, cannot parse {text!r}: {problem}") from exc
    if parsed is None and expected is dict:
        return {}
    if not isinstance(parsed, expected):
        raise ConfigError(f"{name}: expected {what} in YAML/JSON, got {text!r}")
    return parsed
