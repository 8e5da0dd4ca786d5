"""Generate docs/configuration.md from the configuration models (clients/ferryman/config.py).

Usage: ``python scripts/gen_config_docs.py`` rewrites the file;
``python scripts/gen_config_docs.py --check`` exits 1 if it is out of date
(CI's drift check). The models are the one source: each field's type, default
and bounds come from the code, its text from the docstring under it, and the
environment variable that sets it from the override rule of ``load_config``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import sys
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "clients" / "ferryman" / "config.py"
OUT = ROOT / "docs" / "configuration.md"

#: Sections of the file in the order a reader meets them: (YAML key, model, how it appears).
SECTIONS = (
    ("clusters.<alias>", "ClusterConfig", "a mapping of cluster aliases"),
    ("flows[]", "FlowConfig", "a list"),
    ("flows[].naming", "NamingConfig", ""),
    ("wrapper", "WrapperConfig", ""),
    ("deduper", "DeduperConfig", ""),
    ("auditor", "AuditorConfig", ""),
    ("tracing", "TracingConfig", ""),
    ("rpc", "RpcConfig", ""),
    ("rpc.tls", "TlsConfig", ""),
)

HEADER = """# Configuration reference

Generated from `clients/ferryman/config.py` by `python scripts/gen_config_docs.py` (CI fails when it is out of
date): edit the models' docstrings, not this file. One YAML file (`--config` or `FERRYMAN_CONFIG`) holds these
sections; any field of `wrapper`, `deduper`, `auditor`, `tracing` and `rpc` (and of a cluster, by its alias, or of a
flow, by its index) can be set from the environment as `FERRYMAN_<SECTION>__<FIELD>`, e.g.
`FERRYMAN_DEDUPER__INSTANCE_ID=d2`, `FERRYMAN_CLUSTERS__SOURCE__BOOTSTRAP_SERVERS=kafka-a:9092`,
`FERRYMAN_FLOWS__0__NAME=orders`. Without a file, the `KAFKA_CLUSTERS_*`
variables describe a complete one-topic flow (README, "Install and run").
"""


_ANNOTATED = re.compile(r"^Annotated\[(?P<base>.+), Meta\((?P<bounds>[^)]*)\)\]$")
_BOUND_WORDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def _type_text(annotation: str) -> str:
    """``Annotated[int, Meta(ge=1)]`` as ``int, >= 1``; other annotations as written."""
    match = _ANNOTATED.match(annotation)
    if match is None:
        return annotation
    bounds = [f"{_BOUND_WORDS.get(k, k)} {v}" for k, v in (b.split("=") for b in match["bounds"].split(", "))]
    return f"{match['base']}, {', '.join(bounds)}"


def _defaults(model: Any) -> dict[str, str]:
    """Each field's default as the code computes it (factories called)."""
    out: dict[str, str] = {}
    for f in msgspec.structs.fields(model):
        if f.default is not msgspec.NODEFAULT:
            value = f.default
        elif f.default_factory is not msgspec.NODEFAULT:
            value = f.default_factory()
        else:
            out[f.name] = "required"
            continue
        out[f.name] = "<host name>" if f.name == "instance_id" and isinstance(value, str) else _show(value)
    return out


def _show(value: object) -> str:
    if isinstance(value, msgspec.Struct):
        return "(see its section)"
    if isinstance(value, Path):
        return repr(str(value))
    return msgspec.json.encode(value).decode() if not isinstance(value, str) else repr(value)


def _field_docs(cls: ast.ClassDef, model: Any) -> list[tuple[str, str, str, str]]:
    """(name, type, default, doc) of each annotated field, in source order."""
    defaults = _defaults(model)
    out: list[tuple[str, str, str, str]] = []
    body = cls.body
    for i, node in enumerate(body):
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        doc = ""
        nxt = body[i + 1] if i + 1 < len(body) else None
        if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            doc = " ".join(nxt.value.value.split())
        out.append((node.target.id, _type_text(ast.unparse(node.annotation)), defaults[node.target.id], doc))
    return out


def render() -> str:
    """The whole Markdown file."""
    sys.path.insert(0, str(SOURCE.parent.parent))
    config = importlib.import_module("ferryman.config")
    tree = ast.parse(SOURCE.read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    parts = [HEADER]
    for key, name, shape in SECTIONS:
        cls = classes.get(name)
        if cls is None:
            continue
        summary = " ".join((ast.get_docstring(cls) or "").split())
        parts.append(f"\n## `{key}`\n\n{summary}{f' ({shape})' if shape else ''}\n")
        parts.append("\n| field | type | default | meaning |\n|---|---|---|---|\n")
        for field, annotation, default, doc in _field_docs(cls, getattr(config, name)):
            cells = [c.replace("|", "\\|") for c in (annotation, default, doc)]
            parts.append(f"| `{field}` | `{cells[0]}` | `{cells[1]}` | {cells[2]} |\n")
    return "".join(parts)


def main() -> int:
    """Write or check docs/configuration.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
