"""The Apache Pulsar standalone server class: finding its jars, its admin API, and data surviving kill -9."""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from pathlib import Path

import pulsar
import pytest

from cdc.backends.pulsar.connection import open_client
from cdc.servers.pulsar.broker import BrokerError
from cdc.servers.pulsar.standalone import HOME_ENV, POM, ApachePulsar, pulsar_lib, pulsar_version


def _resolved_home(home: Path, key: str) -> None:
    (home / "lib").mkdir(parents=True)
    (home / "lib" / f"pulsar-broker-{pulsar_version()}.jar").write_bytes(b"")
    (home / f"resolved-{key}").touch()


def test_missing_jars_name_the_make_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(BrokerError, match="make pulsar-standalone"):
        pulsar_lib()


def test_jars_of_another_pom_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    _resolved_home(tmp_path, "0123456789abcdef")
    with pytest.raises(BrokerError, match="not resolved"):
        pulsar_lib()


def test_jars_of_this_pom_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    _resolved_home(tmp_path, hashlib.sha256(POM.read_bytes()).hexdigest()[:16])
    assert pulsar_lib() == tmp_path / "lib"


def test_a_broker_that_dies_at_start_up_fails_with_its_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    _resolved_home(tmp_path / "home", hashlib.sha256(POM.read_bytes()).hexdigest()[:16])
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\necho 'Error: Could not find or load main class' >&2\nexit 1\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    broker = ApachePulsar(tmp_path / "data")
    with pytest.raises(BrokerError, match="exited with 1 at start-up.*Could not find or load main class"):
        broker.start(timeout=30)
    assert not broker.running


@pytest.mark.parametrize(
    ("total_gib", "free_gib", "refusal"),
    [
        (2000, 1.5, r"99\.9% full \(1\.5 GiB free\).*read-only above 99\.9% of a disk \(diskUsageThreshold\)"),
        (100, 0.5, r"99\.5% full \(0\.5 GiB free\).*needs 1 GiB free"),
    ],
)
def test_a_disk_the_bookie_takes_as_full_is_named_before_the_broker_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, total_gib: int, free_gib: float, refusal: str
) -> None:
    """A full disk is not made here: the disk's figures are replaced."""
    from types import SimpleNamespace

    from cdc.servers.pulsar import standalone

    gib = 2**30
    monkeypatch.setattr(standalone.shutil, "disk_usage", lambda path: SimpleNamespace(
        total=total_gib * gib, used=int((total_gib - free_gib) * gib), free=int(free_gib * gib)))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))  # started, it would fail otherwise
    broker = ApachePulsar(tmp_path / "data")
    with pytest.raises(BrokerError, match=r"the disk of .*data is " + refusal):
        broker.start(timeout=30)
    assert not broker.running


def test_a_large_shared_disk_with_gigabytes_free_is_not_taken_as_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """252 GiB with 12 GiB free is 95.2% used: BookKeeper's default threshold (95%) would turn the bookie
    read-only there, so our configuration raises it, and the start's check agrees with the bookie."""
    from types import SimpleNamespace

    from cdc.servers.pulsar import standalone

    gib = 2**30
    monkeypatch.setattr(standalone.shutil, "disk_usage",
                        lambda path: SimpleNamespace(total=252 * gib, used=240 * gib, free=12 * gib))
    standalone.check_disk(tmp_path)
    config = ApachePulsar(tmp_path / "data")._write_config().read_text()
    assert f"diskUsageThreshold={standalone.BOOKIE_DISK_THRESHOLD}" in config.splitlines()


def _admin_get(p: ApachePulsar, path: str) -> object:
    with urllib.request.urlopen(p.admin_url + path, timeout=30) as r:
        return json.loads(r.read())


def _admin(p: ApachePulsar, method: str, path: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(p.admin_url + path, method=method), timeout=30):
        pass


def _read_all(p: ApachePulsar, topic: str, partitions: int) -> list[bytes]:
    client = open_client(p.url)
    try:
        values: list[bytes] = []
        for i in range(partitions):
            reader = client.create_reader(f"{topic}-partition-{i}", pulsar.MessageId.earliest)
            while reader.has_message_available():
                values.append(reader.read_next(timeout_millis=30_000).data())
            reader.close()
        return sorted(values)
    finally:
        client.close()


@pytest.mark.slow
def test_partitioned_topic_survives_kill_and_restart(apache_pulsar: ApachePulsar) -> None:
    """Messages produced (and acknowledged by a subscription) survive a SIGKILL of the broker: retention is
    infinite, so the restarted broker keeps acknowledged ledgers, and the ports stay the same."""
    p = apache_pulsar
    topic = "persistent://public/default/standalone-restart"
    p.create_partitioned_topic(topic, 2)
    with pytest.raises(BrokerError, match="409"):
        p.create_partitioned_topic(topic, 2)
    metadata = _admin_get(p, "/admin/v2/persistent/public/default/standalone-restart/partitions")
    assert isinstance(metadata, dict) and metadata["partitions"] == 2

    sent = [f"m{i:05d}".encode() for i in range(3000)]
    client = open_client(p.url)
    try:
        consumer = client.subscribe(topic, "acker", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, block_if_queue_full=True, batching_max_publish_delay_ms=5)
        results: list[pulsar.Result] = []
        for i, value in enumerate(sent):
            producer.send_async(value, lambda res, _mid: results.append(res), partition_key=f"k{i}")
        producer.flush()
        assert results == [pulsar.Result.Ok] * len(sent)
        for _ in sent:
            consumer.acknowledge(consumer.receive(timeout_millis=30_000))
        consumer.close()
    finally:
        client.close()
    assert _read_all(p, topic, 2) == sorted(sent)
    # Unloading closes each partition's ledger and persists the subscription's position past it, so the
    # ledger is acknowledged in full when the broker dies.
    _admin(p, "PUT", "/admin/v2/persistent/public/default/standalone-restart/unload")

    ports = (p.broker_port, p.web_port, p.bookie_port)
    old_pid = p.pid
    started = time.monotonic()
    p.restart(hard=True)
    restart_s = time.monotonic() - started
    print(f"Apache Pulsar restart after kill -9: {restart_s:.1f} s (broker ready in {p.last_start_s:.1f} s)")
    assert p.pid != old_pid and (p.broker_port, p.web_port, p.bookie_port) == ports
    # The restart closed the ledgers written before it; trimming now is what the broker's retention check
    # does on its own a few minutes later (it would delete them all, acknowledged as they are, under
    # Pulsar's default retention of 0).
    for i in range(2):
        _admin(p, "POST", f"/admin/v2/persistent/public/default/standalone-restart-partition-{i}/trim")
    assert _read_all(p, topic, 2) == sorted(sent)
