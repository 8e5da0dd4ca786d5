"""deploy/grafana: the dashboard builds, ferryman.json is what it builds, and every query is valid PromQL over
metrics the services export."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.grafana import dashboard
from tests.helpers.metrics import exported_metric_names, metric_names_in
from tests.helpers.prometheus import promtool

#: Grafana's own variables, as a Prometheus data source substitutes them (ranges are durations there).
_GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "15s"}
_LABEL_VALUES = re.compile(r"label_values\((\w+),\s*\w+\)")


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    return dashboard.build()


def _panels(model: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in model["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _exprs(model: dict[str, Any]) -> dict[str, str]:
    """Every query of every panel, by ``panel title/refId``."""
    return {
        f"{panel['title']}/{target['refId']}": target["expr"]
        for panel in _panels(model)
        for target in panel.get("targets", [])
    }


def test_the_committed_json_is_what_the_code_builds() -> None:
    assert dashboard.main(["--check"]) == 0, "run: python deploy/grafana/dashboard.py"


def test_every_panel_queries_only_exported_metrics(built: dict[str, Any]) -> None:
    exprs = _exprs(built)
    assert len(exprs) > 20
    exported = exported_metric_names()
    unknown = {where: metric_names_in(e) - exported for where, e in exprs.items() if metric_names_in(e) - exported}
    assert not unknown, f"panels query metrics no service exports: {unknown}"


def test_the_flow_variable_reads_an_exported_metric(built: dict[str, Any]) -> None:
    queries = [v["query"] for v in built["templating"]["list"] if v["type"] == "query"]
    assert queries
    for query in queries:
        match = _LABEL_VALUES.fullmatch(query)
        assert match is not None, query
        assert match.group(1) in exported_metric_names()


def test_every_query_is_valid_promql(built: dict[str, Any], tmp_path: Path) -> None:
    """promtool has no expression checker: each query becomes a recording rule, which `check rules` parses."""
    rules = []
    for i, expr in enumerate(_exprs(built).values()):
        promql = expr.replace("$flow", ".*")
        for variable, value in _GRAFANA_VARIABLES.items():
            promql = promql.replace(variable, value)
        rules.append({"record": f"dashboard:query_{i}", "expr": promql})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_panel_ids_are_unique(built: dict[str, Any]) -> None:
    ids = [panel["id"] for panel in _panels(built)]
    assert len(ids) == len(set(ids)), ids
    json.dumps(built)  # and the model is plain JSON
