"""``cdc server pulsar``: Apache Pulsar standalone by default, served until interrupted and stopped without
leaving its JVM behind; clear errors before any start-up (jars not resolved, ports taken, options that
only Apache Pulsar has given to ``--lite``)."""

from __future__ import annotations

import json
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import IO

import pulsar
import pytest
from click.testing import CliRunner

from cdc.backends.pulsar.connection import open_client
from cdc.servers.pulsar.cli import main
from cdc.servers.pulsar.standalone import HOME_ENV


def test_missing_jars_say_how_to_get_them_and_offer_lite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "nowhere"))
    result = CliRunner().invoke(main, ["--port", "0", "--admin-port", "0"])
    assert result.exit_code == 1
    assert "make pulsar-standalone" in result.output
    assert "cdc server pulsar --lite" in result.output and "NOT Apache Pulsar" in result.output


@pytest.mark.parametrize("option", ["--port", "--admin-port"])
def test_a_taken_port_is_named_before_anything_starts(option: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = "--admin-port" if option == "--port" else "--port"
        result = CliRunner().invoke(main, [option, str(port), other, "0"])
    assert result.exit_code == 2
    assert f"Invalid value for {option}: port {port} on 127.0.0.1 is taken" in result.output


@pytest.mark.parametrize("option, value", [("--admin-port", "0"), ("--heap", "1g")])
def test_options_of_apache_pulsar_are_refused_with_lite(option: str, value: str) -> None:
    result = CliRunner().invoke(main, ["--lite", "--port", "0", option, value])
    assert result.exit_code == 2
    assert f"{option} is an option of Apache Pulsar; pulsar-lite (--lite) has none" in result.output


def _processes_mentioning(text: str) -> list[int]:
    """The pids whose command line contains ``text`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def _until(lines: queue.Queue[str], pattern: str, timeout: float, seen: list[str]) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        seen.append(line)
        if match := re.search(pattern, line):
            return match
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s; the command printed: {''.join(seen)}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the broker's JVM through /proc")
@pytest.mark.slow
def test_serves_apache_pulsar_until_interrupted_and_leaves_no_java_behind() -> None:
    """The command as users run it (free ports, 2 partitions per auto-created topic): one message produced
    and consumed through the printed service URL, the topic's metadata through the printed admin URL; then
    Ctrl-C stops the broker, whose JVM and temporary data are gone when the command has exited."""
    command = [sys.executable, "-m", "cdc", "server", "pulsar", "--port", "0", "--admin-port", "0", "--partitions", "2"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stderr, lines), daemon=True).start()
    seen: list[str] = []
    try:
        url = _until(lines, r"service URL\s+(pulsar://127\.0\.0\.1:\d+)", 300, seen)[1]
        admin_url = _until(lines, r"admin URL\s+(http://127\.0\.0\.1:\d+)", 5, seen)[1]
        data_dir = _until(lines, r"data\s+(\S+) \(removed on exit\)", 5, seen)[1]
        jvms = [pid for pid in _processes_mentioning(data_dir) if pid != proc.pid]
        assert len(jvms) == 1, f"expected the broker's one JVM, found {jvms}"

        name = f"cli-{uuid.uuid4().hex[:8]}"
        topic = f"persistent://public/default/{name}"
        client = open_client(url)
        try:
            consumer = client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
            client.create_producer(topic).send(b"through the printed URL")
            assert consumer.receive(timeout_millis=30_000).data() == b"through the printed URL"
        finally:
            client.close()
        with urllib.request.urlopen(f"{admin_url}/admin/v2/persistent/public/default/{name}/partitions", timeout=30) as r:
            assert json.loads(r.read())["partitions"] == 2  # --partitions reached the broker

        proc.send_signal(signal.SIGINT)
        stopped_at = time.monotonic()
        assert proc.wait(timeout=120) == 0
        print(f"stopped in {time.monotonic() - stopped_at:.1f} s after SIGINT")
    finally:
        if proc.poll() is None:
            proc.kill()  # its JVM gets SIGTERM then (die_with_parent)
            proc.wait()
    _until(lines, r"Apache Pulsar stopped", 5, seen)
    assert _processes_mentioning(data_dir) == [], "the broker's JVM outlived the command"
    assert not Path(data_dir).exists()
