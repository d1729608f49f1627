"""faust's table manager, less the second it sleeps before the tables start (docs/faust-notes.md
§14, "Recovery's own waits").

faust's ``TableManager.on_start`` sleeps 1 s before it registers the tables' changelog channels
and starts the recovery (tables defined by agents as they start); the conductor subscribes the
consumer only once the tables are registered, so every start, with a snapshot or without, waited
that second before joining the group.  The worker's one table is defined before the app starts.
"""

from __future__ import annotations

from faust.tables.manager import TableManager

__all__ = ["ShardTables"]


class ShardTables(TableManager):
    """faust's TableManager, its tables registered and its recovery started without a wait."""

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()
