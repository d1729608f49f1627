"""Start a worker: check the cluster's topics, then run the faust worker until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any

from aiokafka import errors as kafka_errors
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from streamdedup.crawler.client import connect
from streamdedup.errors import ClientError, TopicError
from streamdedup.pipeline.routing import OUTPUT_OVERHEAD_BYTES
from streamdedup.settings import Settings

__all__ = [
    "TopicError",
    "arm_stop_deadline",
    "ensure_topics",
    "run_worker",
    "needed_message_bytes",
    "check_message_bytes",
]

log = logging.getLogger("streamdedup.worker")
UNKNOWN_TOPIC_OR_PARTITION = 3  # Kafka's error code


async def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create the pages, output and internal topics if missing; returns the names created.

    The pages topic must have ``partitions`` partitions: its partition p and the internal
    topics' partition p go to the same worker.  The internal topics are created here, before
    faust starts, because a topic that appears after the group's first assignment is not
    assigned until the next rebalance.
    """
    from streamdedup.stream.app import internal_topics

    admin = AIOKafkaAdminClient(**settings.aiokafka_kwargs(), request_timeout_ms=int(timeout * 1000))
    try:  # (the same diagnosis as the clients': a refused login, certificate or non-Kafka port by name)
        await connect(admin.start, admin.close, settings, timeout)
    except ClientError as e:
        raise TopicError(str(e)) from None
    try:
        existing = set(await admin.list_topics())
        if settings.pages_topic in existing:
            meta = await admin.describe_topics([settings.pages_topic])
            n = len(meta[0]["partitions"])
            if n != settings.partitions:
                raise TopicError(
                    f"the pages topic {settings.pages_topic!r} has {n} partitions but --partitions is "
                    f"{settings.partitions}; use --partitions {n} (every worker of a group must agree, "
                    "and it cannot change once the index holds pages)"
                )
        internal = internal_topics(settings)
        fits = {"max.message.bytes": str(needed_message_bytes(settings))}  # a page as large as allowed
        wanted = {
            settings.pages_topic: fits,
            settings.unique_topic: fits,
            settings.near_duplicate_topic: fits,
            settings.verdicts_topic: {},
            settings.dead_letter_topic: fits,
            internal["probes"]: {},
            internal["answers"]: {},
            internal["changelog"]: {"cleanup.policy": "compact"},
        }
        for name in (internal["probes"], internal["answers"], internal["changelog"]):
            if name in existing:
                meta = await admin.describe_topics([name])
                if (n := len(meta[0]["partitions"])) != settings.partitions:
                    raise TopicError(
                        f"the internal topic {name!r} has {n} partitions but --partitions is "
                        f"{settings.partitions}; use --partitions {n}, or a new --app-id"
                    )
        new = [
            NewTopic(t, settings.partitions, settings.replication_factor, topic_configs=config)
            for t, config in wanted.items()
            if t not in existing
        ]
        created = []
        for topic in new:  # one by one: another worker may be creating the same ones
            try:
                response = await admin.create_topics([topic])
            except TopicAlreadyExistsError:
                continue
            # (the broker answers each topic's error in the response, it raises none of them)
            for error in response.to_object()["topic_errors"]:
                kind = kafka_errors.for_code(error["error_code"])
                if error["error_code"] == 0 or kind is TopicAlreadyExistsError:
                    continue
                raise TopicError(
                    f"the broker refused to create topic {error['topic']!r}: {error.get('error_message') or kind.__name__}"
                    f"{_TOPIC_ADVICE.get(kind.__name__, '')}"
                )
            created.append(topic.name)
        await check_message_bytes(admin, settings)
        return created
    finally:
        await admin.close()


#: What to change for the broker's refusals a setting causes.
_TOPIC_ADVICE = {
    "InvalidReplicationFactorError": " (set --replication-factor / STREAMDEDUP_REPLICATION_FACTOR to at most the "
    "number of brokers)",
    "InvalidConfigurationError": " (a topic setting the broker takes from --max-page-bytes: use a smaller one)",
    "PolicyViolationError": " (the cluster's topic creation policy: create the topics beforehand, as the topics job of deploy/docker-compose.yml does)",
    "TopicAuthorizationFailedError": " (grant this client CREATE on the cluster, or create the topics beforehand)",
    "ClusterAuthorizationFailedError": " (grant this client CREATE on the cluster, or create the topics beforehand)",
}


def needed_message_bytes(settings: Settings) -> int:
    """The ``max.message.bytes`` an output topic needs to carry a page of ``--max-page-bytes``."""
    return settings.max_page_bytes + OUTPUT_OVERHEAD_BYTES


async def check_message_bytes(admin: AIOKafkaAdminClient, settings: Settings) -> None:
    """Refuse to start when an output topic that carries pages cannot take a page as large as
    ``--max-page-bytes`` allows: its copies would be refused one by one at run time."""
    need = needed_message_bytes(settings)
    names = [settings.unique_topic, settings.near_duplicate_topic, settings.dead_letter_topic]
    limits = await topic_message_bytes(admin, names)
    small = {name: limit for name, limit in limits.items() if limit < need}
    if small:
        listed = ", ".join(f"{name!r} ({limit} bytes)" for name, limit in sorted(small.items()))
        fits = max(0, min(small.values()) - OUTPUT_OVERHEAD_BYTES)
        raise TopicError(
            f"--max-page-bytes {settings.max_page_bytes} does not fit the output topics' max.message.bytes: "
            f"{listed}; a page that size needs {need} bytes with its key and headers. Raise the topics' "
            f"max.message.bytes (kafka-configs.sh --alter --entity-type topics --entity-name <topic> "
            f"--add-config max.message.bytes={need}) or lower --max-page-bytes / STREAMDEDUP_MAX_PAGE_BYTES "
            f"to at most {fits}"
        )


async def topic_message_bytes(admin: AIOKafkaAdminClient, names: list[str], wait: float = 15.0) -> dict[str, int]:
    """Each topic's effective ``max.message.bytes`` (its own, else the broker's default).

    A topic created a moment ago may be unknown to the broker answering for a while
    (UNKNOWN_TOPIC_OR_PARTITION): asked again until ``wait`` seconds have passed."""
    deadline = time.monotonic() + wait
    while True:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name, {"max.message.bytes": None}) for name in names]
        )
        out: dict[str, int] = {}
        unknown = []
        for response in responses:
            for error_code, error_message, _type, name, entries, *_ in response.resources:
                if error_code == UNKNOWN_TOPIC_OR_PARTITION and time.monotonic() < deadline:
                    unknown.append(name)
                    continue
                if error_code:
                    raise TopicError(
                        f"cannot read the configuration of topic {name!r}: error {error_code} {error_message or ''}"
                    )
                for entry in entries:
                    if entry[0] == "max.message.bytes" and entry[1] is not None:
                        out[name] = int(entry[1])
        if not unknown:
            return out
        await asyncio.sleep(0.2)


def check_web_address(settings: Settings) -> None:
    """TopicError (one line) when the web server (/metrics, POST /check) cannot bind its address:
    faust would find out only after the topics, with a traceback."""
    import socket

    try:
        infos = socket.getaddrinfo(settings.web_host, settings.web_port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise TopicError(
            f"--web-host / STREAMDEDUP_WEB_HOST: cannot resolve {settings.web_host!r} ({e}); use an address of "
            "this machine, e.g. 127.0.0.1 or 0.0.0.0"
        ) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as aiohttp binds)
        try:
            probe.bind(address)
        except OSError as e:
            raise TopicError(
                f"--web-port / STREAMDEDUP_WEB_PORT: cannot listen on {settings.web_host}:{settings.web_port} "
                f"({e.strerror or e}); pick a free port (another worker on this machine needs its own)"
            ) from None


def run_worker(settings: Settings) -> None:
    """Run until stopped (never returns: faust's Worker exits the process)."""
    import faust

    from streamdedup.stream.app import Worker as Dedup

    logging.basicConfig(level=settings.log_level.upper())
    try:
        (settings.data_dir / "faust").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TopicError(
            f"cannot create the data directory {settings.data_dir} ({e}); "
            "use --data-dir / STREAMDEDUP_DATA_DIR with a writable path"
        ) from None
    check_web_address(settings)
    created = asyncio.run(ensure_topics(settings))
    if created:
        log.info("created topics: %s", ", ".join(created))
    worker = Dedup(settings)
    if settings.algorithm == "simhash":
        from streamdedup.index.blocks import warm_up

        warm_up()  # the shard's numba kernels now (or from numba's cache), not in the first probe batch
    from streamdedup.pipeline import wire

    wire.warm_up()  # (the changelog replay's regrouping kernel, likewise)

    class Worker(faust.Worker):  # (named so: its log lines read "[^Worker]: Ready")
        def _schedule_shutdown(self, signal: Any) -> None:
            arm_stop_deadline(settings.stop_timeout)
            super()._schedule_shutdown(signal)

    try:
        Worker(worker.app, loglevel=settings.log_level, quiet=True).execute_from_commandline()
    finally:
        worker.close()


EXIT_STOP_TIMEOUT = 75  # EX_TEMPFAIL: stopped, but not cleanly (no snapshot); nothing is lost


def arm_stop_deadline(seconds: float) -> threading.Timer | None:
    """Exit the process ``seconds`` after a stop began if it has not ended by then.

    faust's shutdown can wait on an offsets request that a rebalance callback made through its
    consumer thread until aiokafka's request timeout (40 s), past an orchestrator's grace period
    (docs/faust-notes.md §11).  Exiting at the deadline is the same as a SIGKILL, which loses
    nothing: offsets are committed only for pages whose outputs the broker acknowledged, so the
    next owner of a partition judges the rest again.  A thread, not a task: the event loop may be
    the thing that is stuck.
    """
    if seconds <= 0:
        return None

    def expire() -> None:
        log.error(
            "the worker did not stop within %.0f s (--stop-timeout); exiting now without a snapshot "
            "(nothing is lost: uncommitted pages are judged again by the next owner)",
            seconds,
        )
        logging.shutdown()
        os._exit(EXIT_STOP_TIMEOUT)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer
