"""A real pair over mutual TLS with role tokens, operated through the ``ferryman`` CLI as a user runs it.

Status and lag figures are checked against what a separate consumer observes in the clusters, a
translated offset against the byte-identical record at the destination, and every refused
connection (untrusted CA, no client certificate, plaintext, wrong token, wrong role) against its
one-line message and exit status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import grpc
import pytest
from confluent_kafka import Consumer
from ferryman.config import RpcConfig, SecretStr, TlsConfig
from ferryman.topics import watermark_offsets

from tests.helpers.certs import make_pki
from tests.helpers.grpc_clients import ControlStream, hello, start_linked_pair
from tests.helpers.kafka import KafkaCluster, create_topic, produce_sequences, read_all, wait_until
from tests.helpers.services import ferryman_cli

pytestmark = pytest.mark.integration

FERRYMAN = Path(sys.executable).parent / "ferryman"
PEER_TOKEN = "pair-peer-secret"
VIEWER_TOKEN = "viewer-secret-42"
PER_PARTITION = 150
#: Cold start of both services on a busy shared machine, then replication of a few hundred records.
START_TIMEOUT_S = 90.0


def _cli_all(*calls: tuple[tuple[str, ...], Mapping[str, str]]) -> list[subprocess.CompletedProcess[str]]:
    """Several commands at once (each takes seconds to start on a busy machine), in the order given."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FERRYMAN_")}
    running = [
        (
            args,
            subprocess.Popen(
                [str(FERRYMAN), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base | dict(env)
            ),
        )
        for args, env in calls
    ]
    done = []
    for args, process in running:
        out, err = process.communicate(timeout=90)
        done.append(subprocess.CompletedProcess([str(FERRYMAN), *args], process.returncode, out, err))
    return done


def _high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """What a separate consumer sees: the log end of each partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "secure-pair-check"})
    try:
        return {p: watermark_offsets(consumer, topic, p, budget_s=10)[1] for p in range(partitions)}
    finally:
        consumer.close()


def _one_line(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert result.stderr.startswith("ferryman: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert VIEWER_TOKEN not in result.stderr and PEER_TOKEN not in result.stderr


def test_status_lag_and_translation_over_mutual_tls_match_the_clusters(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    untrusted = make_pki(tmp_path / "untrusted", ca_name="Untrusted test CA")
    rpc = {
        "tls": {
            "cert_file": str(pki.server_cert),
            "key_file": str(pki.server_key),
            "ca_file": str(pki.ca_cert),
            "require_client_cert": True,
        },
        "auth_token": PEER_TOKEN,
        "tokens": {"viewer": {"secret": VIEWER_TOKEN, "role": "read-only"}},
    }
    client_tls = TlsConfig(cert_file=pki.client_cert, key_file=pki.client_key, ca_file=pki.ca_cert)
    topic = unique_name("secure")
    create_topic(source_cluster.bootstrap_servers, topic, 2)
    produce_sequences(source_cluster.bootstrap_servers, topic, 2, PER_PARTITION)
    pair = start_linked_pair(
        tmp_path,
        source_cluster,
        destination_cluster,
        flow=unique_name("flow"),
        topics=[topic],
        rpc=rpc,
        client_rpc=RpcConfig(tls=client_tls, auth_token=SecretStr(VIEWER_TOKEN)),
    )
    try:
        wait_until(pair.link_up, START_TIMEOUT_S, message="control link up over mutual TLS")
        dst = read_all(
            destination_cluster.bootstrap_servers, f"src.{topic}", expected=2 * PER_PARTITION, timeout_s=START_TIMEOUT_S
        )
        src = read_all(source_cluster.bootstrap_servers, topic)
        ends = _high_watermarks(source_cluster.bootstrap_servers, topic, 2)
        assert ends == {0: PER_PARTITION, 1: PER_PARTITION}

        viewer = {
            "FERRYMAN_TOKEN": VIEWER_TOKEN,
            "FERRYMAN_CA_FILE": str(pki.ca_cert),
            "FERRYMAN_CERT_FILE": str(pki.client_cert),
            "FERRYMAN_KEY_FILE": str(pki.client_key),
        }
        at_deduper = viewer | {"FERRYMAN_SERVER": pair.deduper_address}
        at_wrapper = viewer | {"FERRYMAN_SERVER": pair.wrapper_address}

        def deduper_caught_up() -> dict[str, object] | None:
            result = ferryman_cli("lag", "-o", "json", env=at_deduper)
            assert result.returncode == 0, result.stderr
            data: dict[str, object] = json.loads(result.stdout)
            rows = data["partitions"]
            assert isinstance(rows, list)
            done = len(rows) == 2 and all(r["lag"] == 0 and r["log_end_offset"] == ends[r["partition"]] for r in rows)
            return data if done else None

        lag = wait_until(deduper_caught_up, START_TIMEOUT_S, message="deduper lag 0 against the source ends")
        assert lag is not None and lag["role"] == "deduper"
        for row in lag["partitions"]:  # type: ignore[attr-defined]
            assert row["watermark"] == ends[row["partition"]] - 1  # the last source offset, committed
            assert (row["lag_seconds"], row["duplicates_dropped"]) == (0, 0)  # caught up, nothing replayed
        status_d, lag_w, status_w = _cli_all(
            (("status", "-o", "json"), at_deduper),
            (("lag", "-o", "json"), at_wrapper),
            (("status", "-o", "json"), at_wrapper),
        )
        status = json.loads(status_d.stdout)
        assert int(status["records_written"]) == sum(len(r) for r in dst.values()) == 2 * PER_PARTITION
        assert int(status["duplicates_dropped"]) == 0 and status["connected_wrappers"] == [f"{pair.flow}-w1"]
        assert status["version"] and status["assigned_staging_partitions"] and status["unavailable_reason"] == ""
        wrapper_lag = json.loads(lag_w.stdout)
        assert wrapper_lag["role"] == "wrapper"
        for row in wrapper_lag["partitions"]:
            assert (row["log_end_offset"], row["wrapped"]) == (ends[row["partition"]], ends[row["partition"]] - 1)
        wrapper = json.loads(status_w.stdout)
        assert wrapper["control_links"] == [{"address": pair.deduper_address, "connected": True}]
        assert int(wrapper["records_sent"]) >= 2 * PER_PARTITION and wrapper["version"] == status["version"]

        # Offset translation: the destination record at the answer is the source record, byte for byte.
        positions = ((0, 0), (1, 77), (0, PER_PARTITION - 1))
        *answers, table = _cli_all(
            *((("offsets", "translate", topic, str(p), str(o), "-o", "json"), at_deduper) for p, o in positions),
            (("offsets", "translate", topic, "1", "5"), at_deduper),
        )
        for (partition, offset), result in zip(positions, answers, strict=True):
            assert result.returncode == 0, result.stderr
            answer = json.loads(result.stdout)
            assert answer["destination"]["topic"] == f"src.{topic}"
            assert answer["destination"]["partition"] == partition
            copy = next(r for r in dst[partition] if r.offset == answer["destination"]["offset"])
            original = next(r for r in src[partition] if r.offset == offset)
            assert copy.content() == original.content()
        assert table.returncode == 0 and "destination" in table.stdout and f"src.{topic}" in table.stdout

        # Positions not (yet) replicated, the wrong service, and every refused connection: one line each,
        # its own exit status, no secret shown.
        untrusted_ca = at_deduper | {"FERRYMAN_CA_FILE": str(untrusted.ca_cert), "FERRYMAN_SERVER_NAME": "localhost"}
        no_client_cert = {k: v for k, v in at_deduper.items() if k not in {"FERRYMAN_CERT_FILE", "FERRYMAN_KEY_FILE"}}
        foreign_cert = at_deduper | {
            "FERRYMAN_CERT_FILE": str(untrusted.client_cert),
            "FERRYMAN_KEY_FILE": str(untrusted.client_key),
        }
        plaintext = {"FERRYMAN_SERVER": pair.deduper_address, "FERRYMAN_TOKEN": VIEWER_TOKEN}
        no_token = {k: v for k, v in at_deduper.items() if k != "FERRYMAN_TOKEN"}
        expected = [
            ((("offsets", "translate", topic, "0", str(PER_PARTITION)), at_deduper), 7, ("not replicated yet",)),
            ((("offsets", "translate", "no-such-topic", "0", "0"), at_deduper), 7, ("no offset mapping",)),
            ((("offsets", "translate", topic, "0", "0"), at_wrapper), 9, ("does not serve",)),
            ((("offsets", "translate", topic, "-1", "0"), at_deduper), 2, ()),
            ((("status", "--timeout", "3"), untrusted_ca), 8, ("TLS with",)),
            ((("status", "--timeout", "3"), no_client_cert), 4, ("no answer", "pass --cert-file")),
            ((("status", "--timeout", "3"), foreign_cert), 4, ("does not trust",)),
            ((("status", "--timeout", "3"), plaintext), 4, ("pass --ca-file",)),
            ((("status",), at_deduper | {"FERRYMAN_TOKEN": "guess"}), 5, ("UNAUTHENTICATED",)),
            ((("status",), no_token), 5, ("MISSING_TOKEN",)),
        ]
        for (_, code, says), result in zip(expected, _cli_all(*(e[0] for e in expected)), strict=True):
            _one_line(result, code, *says)

        # The viewer's token cannot join the control link (it needs the peer role).
        with ControlStream(pair.deduper_address, pair.rpc) as rogue:
            rogue.send(hello(flow=pair.flow, wrapper_id="rogue"))
            with pytest.raises(grpc.RpcError) as err:
                rogue.receive()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "peer" in (err.value.details() or "")
    finally:
        pair.stop()
