"""The order rule: which of two near-duplicates is flagged, the same in ``scan`` and the worker.

**First stored wins, at the pair's canonical group.**  Two fingerprints within ``k`` bits
agree on every bit of at least one first-level *group* of the table design (for the default
4 x 4 design: one of the four 16-bit blocks; see :meth:`TableDesign.groups`).  The lowest
such group is the pair's *canonical group*.  A page is a near-duplicate of a candidate only
if the candidate was stored before it in that group's store.  The worker shards each group
by the value of its bits, so both pages of a pair probe the canonical group's shard, which
handles its probes one at a time: one of the two was stored there first, and only the other
one finds it.  Hence, for every pair within ``k`` bits (different ids), exactly one of the two
pages has the other as an earlier candidate, whatever the arrival order, the partitions or
the number of workers; in particular neither a pair is lost nor are both flagged.

* **Stored once, position kept**: a page whose id and fingerprint are already stored (a
  replay after a crash, or a re-fetch with unchanged content) is not stored again and keeps
  the position of its first store: it is judged only against pages stored before that.
* **Never itself**: a stored page with the same id (hash) is never a candidate.
* **The match** (the verdict's ``match_*``/``distance``) is, among the candidates, the
  nearest; then the one whose canonical group with the page is lowest; then the first
  stored.  Every candidate is found in exactly one group (its canonical one), and a shard
  keeps its rows in store order, so the worker can apply this without a global clock.

In ``scan`` there is one store and the arrival order is the input order, so "stored before"
is "earlier in the input" and the canonical group only breaks ties between equally near
candidates.  The worker with one input partition stores pages in offset order in every
shard (a record the consumer skipped and the worker reads again later is judged before the
records behind it, which wait for it), so it gives ``scan``'s verdicts on the same order.  With several partitions the
stores of different groups may see concurrent pages in different orders: each pair is still
decided once, by its canonical group, but "stored before" is then not one global order.

>>> masks = group_masks(TableDesign.named("16"))
>>> [hex(int(m)) for m in masks]
['0xffff', '0xffff0000', '0xffff00000000', '0xffff000000000000']
>>> canonical_groups(np.array([0x1_0000], dtype=np.uint64), masks).tolist()  # differ in block 1 only
[0]
>>> canonical_groups(np.array([0x1_0001], dtype=np.uint64), masks).tolist()  # blocks 0 and 1
[2]
"""

from __future__ import annotations

import numpy as np

from streamdedup.index.tables import TableDesign

__all__ = ["group_masks", "canonical_groups"]


def group_masks(design: TableDesign) -> np.ndarray:
    """The bits of each first-level group of ``design``, as uint64 masks in group order."""
    return np.array([sum(1 << b for b in bits) for bits, _ in design.groups()], dtype=np.uint64)


def canonical_groups(xor: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """The lowest group on which each pair agrees, given ``a ^ b`` per pair (-1: none)."""
    xor = np.asarray(xor, dtype=np.uint64)
    agree = (xor[:, None] & masks[None, :]) == 0
    return np.where(agree.any(axis=1), agree.argmax(axis=1), -1)
