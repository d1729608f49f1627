"""Start a worker: check the cluster's topics, then run the faust worker until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streamdedup.crawler.client import connect
from streamdedup.errors import ClientError, TopicError
from streamdedup.settings import Settings

__all__ = ["TopicError", "ensure_topics", "run_worker"]

log = logging.getLogger("streamdedup.worker")


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
        wanted = {
            settings.pages_topic: {},
            settings.unique_topic: {},
            settings.near_duplicate_topic: {},
            settings.verdicts_topic: {},
            settings.dead_letter_topic: {},
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
                await admin.create_topics([topic])
                created.append(topic.name)
            except TopicAlreadyExistsError:
                pass
        return created
    finally:
        await admin.close()


def run_worker(settings: Settings) -> None:
    """Run until stopped (never returns: faust's Worker exits the process)."""
    import faust

    from streamdedup.stream.app import Worker

    logging.basicConfig(level=settings.log_level.upper())
    try:
        (settings.data_dir / "faust").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TopicError(
            f"cannot create the data directory {settings.data_dir} ({e}); "
            "use --data-dir / STREAMDEDUP_DATA_DIR with a writable path"
        ) from None
    created = asyncio.run(ensure_topics(settings))
    if created:
        log.info("created topics: %s", ", ".join(created))
    worker = Worker(settings)
    try:
        faust.Worker(worker.app, loglevel=settings.log_level, quiet=True).execute_from_commandline()
    finally:
        worker.close()
