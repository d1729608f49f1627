"""A private, throw-away Apache Kafka broker for the test suite.

Wraps ``deploy/local/kafka.sh``: picks free ports on 127.0.0.1, starts a single-node
KRaft broker named ``pytest-<pid>`` beside any broker the developer already runs
(installing the jars with Maven first if ``deploy/local/lib`` is missing), and stops
and removes it again. Tests never skip for want of a broker: if it cannot start,
``LocalKafka.start()`` raises ``KafkaBrokerError`` with the broker log tail.

Typical session fixture (conftest.py)::

    from tests.kafka_broker import LocalKafka

    @pytest.fixture(scope="session")
    def kafka():
        broker = LocalKafka()
        broker.start()
        yield broker
        broker.stop()

The broker also stops by itself when the test process dies without calling ``stop()``
(``KAFKA_WATCH_PID``), so a killed pytest run does not leak a JVM.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEPLOY_DIR = REPO_ROOT / "deploy" / "local"
KAFKA_SH = DEPLOY_DIR / "kafka.sh"

DEFAULT_SASL_USER = "streamdedup"
DEFAULT_SASL_PASSWORD = "streamdedup-secret"
SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
#: Listener -> (security protocol, port attribute). "EXPIRED" is an SSL listener whose
#: certificate expired in 2020 (for tests of TLS failures).
LISTENERS = {
    "PLAINTEXT": ("PLAINTEXT", "port"),
    "SASL_PLAINTEXT": ("SASL_PLAINTEXT", "sasl_port"),
    "SSL": ("SSL", "ssl_port"),
    "SASL_SSL": ("SASL_SSL", "sasl_ssl_port"),
    "EXPIRED": ("SSL", "expired_ssl_port"),
}

log = logging.getLogger(__name__)
_instance_counter = itertools.count(1)

__all__ = [
    "KafkaBrokerError",
    "LocalKafka",
    "free_ports",
    "unique_name",
]


class KafkaBrokerError(RuntimeError):
    """The local broker could not be started, stopped or used."""


def unique_name(prefix: str = "t") -> str:
    """A unique topic / consumer-group / client name, e.g. ``dedup-in-3f9c1a2b7d4e``.

    Kafka topic names allow ``[a-zA-Z0-9._-]``, at most 249 characters.
    """
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that were free on 127.0.0.1 a moment ago.

    All sockets are held open until every port is chosen, so the ports differ.
    Another process can still take one before the broker binds it; ``LocalKafka.start``
    retries with new ports in that case.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _run_coro_blocking(coro_factory):
    """Run an async helper from sync code, also when an event loop is already running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_factory())
    # Called from inside a running loop (async test): use a private loop in a thread.
    result: dict[str, Any] = {}

    def runner() -> None:
        try:
            result["value"] = asyncio.run(coro_factory())
        except BaseException as exc:  # re-raised in the caller's thread
            result["error"] = exc

    t = threading.Thread(target=runner, name="kafka-broker-helper")
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


class LocalKafka:
    """One broker instance started through ``deploy/local/kafka.sh``.

    Attributes after ``start()``: ``bootstrap`` ("127.0.0.1:PORT", PLAINTEXT),
    ``sasl_bootstrap`` (SASL_PLAINTEXT listener: SCRAM-SHA-256, SCRAM-SHA-512, PLAIN),
    ``ssl_bootstrap`` (SSL), ``sasl_ssl_bootstrap`` (SASL_SSL, the same mechanisms),
    ``expired_ssl_bootstrap`` (SSL with a certificate that expired in 2020), ``ca_file`` (the PEM
    CA that signed the broker's certificates, made at start), ``client_cert_file`` /
    ``client_key_file`` (a client certificate from that CA), ``sasl_user``, ``sasl_password``,
    ``port``, ``sasl_port``, ``ssl_port``, ``sasl_ssl_port``, ``expired_ssl_port``,
    ``controller_port``, ``version`` (Kafka version string), ``log_path``.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        sasl_user: str = DEFAULT_SASL_USER,
        sasl_password: str = DEFAULT_SASL_PASSWORD,
        start_timeout: int = 60,
        heap: str | None = None,
        keep_run_dir: bool | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        if name is None:
            # pytest-<pid>; a second broker in the same process gets pytest-<pid>-2, ...
            n = next(_instance_counter)
            name = f"pytest-{os.getpid()}" + (f"-{n}" if n > 1 else "")
        self.name = name
        self.sasl_user = sasl_user
        self.sasl_password = sasl_password
        self.start_timeout = start_timeout
        self.heap = heap
        if keep_run_dir is None:
            keep_run_dir = os.environ.get("KAFKA_TEST_KEEP_RUN", "") not in ("", "0")
        self.keep_run_dir = keep_run_dir
        self.extra_env = dict(extra_env or {})
        self.port = self.controller_port = self.sasl_port = 0
        self.ssl_port = self.sasl_ssl_port = self.expired_ssl_port = 0
        self.version: str | None = None
        self.started = False
        self.run_dir = DEPLOY_DIR / "run" / self.name
        self.log_path = self.run_dir / "kafka.log"
        self.tls_dir = self.run_dir / "tls"

    # ------------------------------------------------------------------ addresses

    @property
    def bootstrap(self) -> str:
        self._require_started()
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        self._require_started()
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def ssl_bootstrap(self) -> str:
        self._require_started()
        return f"127.0.0.1:{self.ssl_port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        self._require_started()
        return f"127.0.0.1:{self.sasl_ssl_port}"

    @property
    def expired_ssl_bootstrap(self) -> str:
        """An SSL listener presenting a certificate (from ``ca_file``'s CA) that expired in 2020."""
        self._require_started()
        return f"127.0.0.1:{self.expired_ssl_port}"

    @property
    def ca_file(self) -> Path:
        """The CA certificate (PEM) to trust for the SSL and SASL_SSL listeners; new on every start."""
        self._require_started()
        return self.tls_dir / "ca.pem"

    @property
    def client_cert_file(self) -> Path:
        self._require_started()
        return self.tls_dir / "client.pem"

    @property
    def client_key_file(self) -> Path:
        self._require_started()
        return self.tls_dir / "client.key"

    def bootstrap_for(self, listener: str) -> str:
        """The address of a listener by name: one of :data:`LISTENERS`."""
        self._require_started()
        return f"127.0.0.1:{getattr(self, LISTENERS[listener][1])}"

    def ssl_context(self, cafile: str | Path | None = None) -> ssl.SSLContext:
        """A verifying client context that trusts ``cafile`` (default: the broker's CA)."""
        return ssl.create_default_context(cafile=str(cafile or self.ca_file))

    @property
    def faust_broker_url(self) -> str:
        """For ``faust.App(..., broker=...)``."""
        return f"kafka://{self.bootstrap}"

    def client_kwargs(
        self, mechanism: str | None = None, *, password: str | None = None, tls: bool = False
    ) -> dict[str, Any]:
        """Connection kwargs for aiokafka producers/consumers/admin clients.

        ``mechanism=None``: the PLAINTEXT listener (``tls``: SSL). Otherwise one of
        ``SASL_MECHANISMS`` on the SASL_PLAINTEXT listener (``tls``: SASL_SSL) with the test user
        (``password`` overrides, e.g. to test failures). TLS trusts the broker's CA.
        """
        if mechanism is not None and mechanism not in SASL_MECHANISMS:
            raise ValueError(f"mechanism must be one of {SASL_MECHANISMS}, got {mechanism!r}")
        listener = ("SASL_" if mechanism else "") + ("SSL" if tls else "PLAINTEXT")
        kw: dict[str, Any] = {"bootstrap_servers": self.bootstrap_for(listener)}
        if listener != "PLAINTEXT":
            kw["security_protocol"] = listener
        if tls:
            kw["ssl_context"] = self.ssl_context()
        if mechanism is not None:
            kw.update(
                sasl_mechanism=mechanism,
                sasl_plain_username=self.sasl_user,
                sasl_plain_password=self.sasl_password if password is None else password,
            )
        return kw

    def settings_env(self, listener: str = "PLAINTEXT", mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
        """``STREAMDEDUP_*`` variables that connect streamdedup (worker, CLI, Scrapy pipeline) to a listener.

        SASL listeners log in as the test user with ``mechanism``; TLS ones trust ``ca_file``.
        """
        protocol = LISTENERS[listener][0]
        env = {"STREAMDEDUP_BROKERS": self.bootstrap_for(listener), "STREAMDEDUP_SECURITY_PROTOCOL": protocol}
        if protocol.startswith("SASL_"):
            env.update(
                STREAMDEDUP_SASL_MECHANISM=mechanism,
                STREAMDEDUP_SASL_USERNAME=self.sasl_user,
                STREAMDEDUP_SASL_PASSWORD=self.sasl_password,
            )
        if protocol.endswith("SSL"):
            env["STREAMDEDUP_SSL_CAFILE"] = str(self.ca_file)
        return env

    # ------------------------------------------------------------------ lifecycle

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Never inherit a developer's instance settings (e.g. KAFKA_KEEP_DATA=1 in their shell).
        for k in list(env):
            if k.startswith("KAFKA_") and k not in ("KAFKA_VERSION",):
                del env[k]
        env.update(
            KAFKA_NAME=self.name,
            KAFKA_PORT=str(self.port),
            KAFKA_CONTROLLER_PORT=str(self.controller_port),
            KAFKA_SASL_PORT=str(self.sasl_port),
            KAFKA_SSL_PORT=str(self.ssl_port),
            KAFKA_SASL_SSL_PORT=str(self.sasl_ssl_port),
            KAFKA_SSL_EXPIRED_PORT=str(self.expired_ssl_port),
            KAFKA_SASL_USER=self.sasl_user,
            KAFKA_SASL_PASSWORD=self.sasl_password,
            KAFKA_START_TIMEOUT=str(self.start_timeout),
            KAFKA_WATCH_PID=str(os.getpid()),
        )
        if self.heap:
            env["KAFKA_HEAP"] = self.heap
        env.update(self.extra_env)
        return env

    def _kafka_sh(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(KAFKA_SH), *args],
            env=self._env(),
            cwd=str(REPO_ROOT),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        for line in proc.stdout.splitlines():
            log.info("%s", line)
        return proc

    def install(self) -> None:
        """Resolve the broker jars (Maven, ~/.m2) unless deploy/local/lib is complete."""
        if not (DEPLOY_DIR / "lib" / ".installed").exists():
            # Outside pytest's capture: explain why the first session start takes longer.
            print(
                "\n[kafka_broker] deploy/local/lib is empty: installing the Kafka jars with Maven "
                "(first run downloads ~45 MB into ~/.m2) ...",
                file=sys.__stderr__,
                flush=True,
            )
        proc = self._kafka_sh("install", timeout=900)
        if proc.returncode != 0:
            raise KafkaBrokerError(f"deploy/local/kafka.sh install failed:\n{proc.stdout}")

    def start(self) -> LocalKafka:
        if self.started:
            return self
        self.install()
        self._clean_stale_run_dirs()
        t0 = time.monotonic()
        last = ""
        for attempt in range(3):
            (
                self.port,
                self.controller_port,
                self.sasl_port,
                self.ssl_port,
                self.sasl_ssl_port,
                self.expired_ssl_port,
            ) = free_ports(6)
            proc = self._kafka_sh("start", timeout=self.start_timeout + 60)
            if proc.returncode == 0:
                self.started = True
                self.version = self._read_instance_env().get("KAFKA_VERSION_RUNNING")
                log.info("kafka broker %s up at %s in %.1fs", self.name, self.bootstrap, time.monotonic() - t0)
                return self
            last = proc.stdout
            # A free port was taken by someone else in between: try again with new ones.
            if "already in use" not in last and "Address already in use" not in last:
                break
            log.warning("port race starting %s (attempt %d), retrying", self.name, attempt + 1)
        raise KafkaBrokerError(
            f"could not start the local Kafka broker {self.name!r} "
            f"(ports {self.port}/{self.controller_port}/{self.sasl_port}/{self.ssl_port}/"
            f"{self.sasl_ssl_port}/{self.expired_ssl_port}):\n{last}"
        )

    def stop(self) -> None:
        """Stop the broker (SIGTERM, SIGKILL after 30 s) and remove its run dir."""
        proc = self._kafka_sh("stop", timeout=200)  # (the first stop of a jar set writes the class archive)
        self.started = False
        if proc.returncode != 0:
            raise KafkaBrokerError(f"deploy/local/kafka.sh stop failed:\n{proc.stdout}")
        if not self.keep_run_dir:
            self._kafka_sh("clean", timeout=60)

    def _clean_stale_run_dirs(self) -> None:
        """Remove run/pytest-<pid>* dirs left by test runs that were killed (their pid is gone)."""
        for d in (DEPLOY_DIR / "run").glob("pytest-*"):
            pid = d.name.split("-")[1]
            if not pid.isdigit() or d.name == self.name:
                continue
            try:
                os.kill(int(pid), 0)
                continue  # that test run is still alive
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            # `clean` refuses to touch a running broker.
            subprocess.run(
                [str(KAFKA_SH), "clean"],
                env={**self._env(), "KAFKA_NAME": d.name},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=60,
            )

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def is_running(self) -> bool:
        return self._kafka_sh("status", timeout=30).returncode == 0

    def log_tail(self, lines: int = 50) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def _read_instance_env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        try:
            for line in (self.run_dir / "instance.env").read_text().splitlines():
                k, _, v = line.partition("=")
                out[k] = v
        except FileNotFoundError:
            pass
        return out

    def _require_started(self) -> None:
        if not self.started:
            raise KafkaBrokerError("the broker is not started; call start() first")

    # ------------------------------------------------------------------ topics

    async def create_topic_async(
        self,
        name: str,
        partitions: int = 1,
        config: Mapping[str, str] | None = None,
        *,
        replication_factor: int = 1,
        exist_ok: bool = False,
        timeout: float = 30.0,
    ) -> None:
        """Create a topic and wait until every partition has a leader."""
        from aiokafka import errors
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=int(timeout * 1000))
        await admin.start()
        try:
            resp = await admin.create_topics(
                [
                    NewTopic(
                        name=name,
                        num_partitions=partitions,
                        replication_factor=replication_factor,
                        topic_configs={k: str(v) for k, v in (config or {}).items()},
                    )
                ],
                timeout_ms=int(timeout * 1000),
            )
            for topic_error in resp.to_object()["topic_errors"]:
                code = topic_error["error_code"]
                if code == 0:
                    continue
                err_cls = errors.for_code(code)
                if exist_ok and err_cls is errors.TopicAlreadyExistsError:
                    continue
                raise err_cls(
                    f"create_topic({topic_error['topic']!r}): {topic_error.get('error_message') or err_cls.__name__}"
                )

            deadline = time.monotonic() + timeout
            while True:
                topics = await admin.describe_topics([name])
                parts = topics[0]["partitions"] if topics and topics[0]["error_code"] == 0 else []
                if len(parts) >= partitions and all(p["leader"] >= 0 for p in parts):
                    return
                if time.monotonic() > deadline:
                    raise KafkaBrokerError(f"topic {name!r} has no leaders after {timeout}s: {topics!r}")
                await asyncio.sleep(0.05)
        finally:
            await admin.close()

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Create ``name`` with ``partitions`` partitions and topic ``config``; returns the name.

        Usable from sync tests/fixtures and from inside a running event loop; in async code
        prefer ``await create_topic_async(...)``.
        """
        self._require_started()
        _run_coro_blocking(lambda: self.create_topic_async(name, partitions, config, **kwargs))
        return name
