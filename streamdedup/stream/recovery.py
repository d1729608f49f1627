"""faust's table manager and recovery, less their waits (docs/faust-notes.md §14, "Recovery's own
waits").

faust's ``TableManager.on_start`` sleeps 1 s before it registers the tables' changelog channels
and starts the recovery (tables defined by agents as they start); the conductor subscribes the
consumer only once the tables are registered, so every start, with a snapshot or without, waited
that second before joining the group.  The worker's one table is defined before the app starts.

faust's ``Recovery`` reads the changelogs' end offsets (``_build_highwaters``) and first offsets
(``_build_offsets``) through its consumer's thread, on the connection where that consumer's fetch
is in flight; the broker answers a connection's requests in order and faust's fetch waits up to
1.5 s for records, so each read took 1.2-1.5 s at every start and rebalance.  ``ShardRecovery``
reads them by a client of its own (the same ListOffsets requests, the same isolation level), and
falls back to faust's consumer if that read fails.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP

__all__ = ["ShardTables", "ShardRecovery", "ListOffsets"]

log = logging.getLogger(__name__)

#: (topic, partition) pairs, latest= -> {(topic, partition): offset}: connection.list_offsets
ListOffsets = Callable[..., Awaitable[dict[tuple[str, int], int]]]

#: Seconds an offsets read of our own may take before faust's consumer reads them instead.
OWN_OFFSETS_TIMEOUT = 10.0


class _OwnOffsets:
    """The two offsets reads faust's recovery makes of its consumer, made by ``read`` instead."""

    def __init__(self, consumer: Any, read: ListOffsets) -> None:
        self.consumer, self.read = consumer, read

    async def _offsets(self, tps: Iterable[TP], latest: bool) -> dict[TP, int]:
        tps = list(tps)
        if not tps:
            return {}
        try:
            got = await asyncio.wait_for(
                self.read([(tp.topic, tp.partition) for tp in tps], latest=latest), OWN_OFFSETS_TIMEOUT
            )
            return {TP(t, p): offset for (t, p), offset in got.items()}
        except Exception as e:  # (a timeout too) faust's consumer reads them, as faust does
            log.warning(
                "cannot read the %s offsets of %d changelog partitions by our own client (%r): faust's consumer reads them",
                "end" if latest else "first",
                len(tps),
                e,
            )
            return await (self.consumer.highwaters if latest else self.consumer.earliest_offsets)(*tps)

    async def highwaters(self, *tps: TP) -> dict[TP, int]:
        return await self._offsets(tps, latest=True)

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        return await self._offsets(tps, latest=False)


class ShardRecovery(Recovery):
    """faust's Recovery, its changelogs' end and first offsets read by ``read`` (None: by faust's
    consumer, as faust does)."""

    read: ListOffsets | None = None

    def _repr_name(self) -> str:
        return "Recovery"  # its log lines as faust's ("[^---Recovery]: Worker ready"), which operators grep

    async def _build_highwaters(self, consumer: Any, tps: Any, destination: Any, title: str) -> None:
        own: Any = consumer if self.read is None else _OwnOffsets(consumer, self.read)
        await super()._build_highwaters(own, tps, destination, title)

    async def _build_offsets(self, consumer: Any, tps: Any, destination: Any, title: str) -> None:
        own: Any = consumer if self.read is None else _OwnOffsets(consumer, self.read)
        await super()._build_offsets(own, tps, destination, title)


class ShardTables(TableManager):
    """faust's TableManager, its tables registered and its recovery started without a wait, its
    recovery a :class:`ShardRecovery` (reading offsets by ``read_offsets``; see :meth:`using`)."""

    read_offsets: ListOffsets | None = None

    @classmethod
    def using(cls, read_offsets: ListOffsets) -> type[ShardTables]:
        """This manager, its recovery reading the changelogs' offsets by ``read_offsets`` (for
        faust's ``TableManager=`` setting, which takes a class)."""
        return type(cls.__name__, (cls,), {"read_offsets": staticmethod(read_offsets)})

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            recovery = ShardRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
            recovery.read = self.read_offsets
            self._recovery = recovery
        return self._recovery

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()
