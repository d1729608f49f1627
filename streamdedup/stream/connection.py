"""How the worker reaches the cluster: the settings' brokers and credentials in faust's terms,
and the reads it makes with a client of its own.

Kept out of :mod:`streamdedup.settings` so that the settings (and every layer below the stream
shell) import nothing from faust.
"""

from __future__ import annotations

from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.types.auth import SASLMechanism

from streamdedup.settings import Settings

__all__ = ["faust_broker_url", "faust_credentials", "end_offsets"]


def faust_broker_url(settings: Settings) -> str:
    """For ``faust.App(broker=...)``: ``kafka://h1:p1;h2:p2``."""
    return "kafka://" + ";".join(settings.brokers)


def faust_credentials(settings: Settings) -> Any:
    """For ``faust.App(broker_credentials=...)``: SASLCredentials, SSLCredentials or None.

    faust (``credentials_to_aiokafka_auth``) turns them back into aiokafka's security_protocol,
    sasl_* and ssl_context kwargs.  SASLCredentials means SASL_SSL only when it has an
    ssl_context, so SASL_SSL always passes one; SSLCredentials needs its context explicitly.
    Also pass ``env={}`` to faust.App: faust reads BROKER_URL etc. from os.environ and lets
    them override the App's arguments.
    """
    if settings.security_protocol == "PLAINTEXT":
        return None
    if settings.security_protocol == "SSL":
        return faust.SSLCredentials(settings.ssl_context())
    return faust.SASLCredentials(
        username=settings.sasl_username,
        password=settings.sasl_password,
        mechanism=SASLMechanism(settings.sasl_mechanism),
        ssl_context=settings.ssl_context(),
    )


async def end_offsets(settings: Settings, topic: str, partitions: list[int]) -> dict[int, int]:
    """The end offsets (high watermarks) of ``topic``'s ``partitions``, read by a consumer of our
    own.  faust serves its consumer's offsets requests from the consumer thread, and inside a
    rebalance callback that thread is busy running the rebalance: such a request waits until
    aiokafka's request timeout or a stop cancels it (docs/faust-notes.md §11)."""
    consumer = AIOKafkaConsumer(
        **settings.aiokafka_kwargs(),
        group_id=None,
        enable_auto_commit=False,
        client_id=f"{settings.app_id}-end-offsets",
    )
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
        return {tp.partition: int(end) for tp, end in ends.items()}
    finally:
        await consumer.stop()
