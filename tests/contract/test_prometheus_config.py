"""deploy/prometheus: the scrape config and alert rules pass promtool, their unit tests pass, and every metric
they use is one the services export."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers.metrics import exported_metric_names, metric_names_in
from tests.helpers.prometheus import promtool

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
#: Series Prometheus makes itself for every target.
_SCRAPE_SERIES = {"up"}


def test_scrape_config_is_valid() -> None:
    result = promtool("check", "config", "prometheus.yml", cwd=DEPLOY)  # checks the rule files it names too
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_are_valid() -> None:
    result = promtool("check", "rules", "ferryman-alerts.yml", cwd=DEPLOY)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_fire_as_their_unit_tests_say() -> None:
    result = promtool("test", "rules", "ferryman-alerts.test.yml", cwd=DEPLOY)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_use_only_exported_metrics() -> None:
    rules = yaml.safe_load((DEPLOY / "ferryman-alerts.yml").read_text())
    exported = exported_metric_names() | _SCRAPE_SERIES
    used = {rule["alert"]: metric_names_in(rule["expr"]) for group in rules["groups"] for rule in group["rules"]}
    unknown = {alert: names - exported for alert, names in used.items() if names - exported}
    assert not unknown, f"alerts on metrics no service exports: {unknown}"
    assert all(used.values()), "an alert whose expression names no metric: the name parser missed it"
