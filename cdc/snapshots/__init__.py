"""Chunked snapshots: a table's rows read in key-range chunks by the executors while its changes keep flowing.

The backend-neutral part of ``startingOffsets=snapshot`` with ``snapshot.mode=chunked``; a backend provides
the database-specific part through :class:`.planning.ChunkedSnapshot`. The interface, in four pieces:

**The chunker** (:meth:`~.planning.ChunkedSnapshot.bounds`). Each table is cut into key ranges
``(after, upto]`` in its primary key's order, found without a full scan (an index scan of the next chunk's
keys), every chunk at most twice the chunk size; the last chunk ends at the table's largest key when the
snapshot started (``last``): rows inserted above it arrive as changes. Keys travel in the database's text
form and are compared by the database, collations included.

**The cut** (:class:`.state.Cut`). A batch that reads chunks reads them as of one consistent cut of the table
and its change log, opened by the backend when it plans the batch and held until it plans the next one. The
batch's change range ends exactly at the cut's position. The offset holds the cut and each table's cursor
(:mod:`.state`), never one entry per chunk.

**The emitted ``_seq`` rule.** A row read at a cut carries the cut's ``seq``: larger than every change before
the cut's position, smaller than every change at or after it. So per key, every change emitted after the row
is newer than it, and no row overwrites a newer change, whatever the sink.

**Holding back** (:mod:`.holdback`). Until a key's chunk is emitted its changes are not delivered: the chunk
includes them. Reads of a chunk are exact with respect to their cut; a replayed batch whose cut was lost
yields what its first complete read kept (:mod:`.store`), or reads at a new cut that the next batch's
planning learns and holds back (``late`` entries).

Modules: :mod:`.state` (the offset's part), :mod:`.planning` (the backend protocol and the planner's steps),
:mod:`.holdback` (the rule a change read applies), :mod:`.store` (write-once chunk files).
"""

from cdc.snapshots.state import Chunk, Cut, Key, Late, SnapshotState, TableCursor

__all__ = ["Chunk", "Cut", "Key", "Late", "SnapshotState", "TableCursor"]
