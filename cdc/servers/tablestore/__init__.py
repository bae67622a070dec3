"""A local Tablestore server that speaks the real protocol: the table API and the Tunnel service.

Run it::

    cdc server tablestore --host 127.0.0.1 --port 8500 --data-dir ./ots-data \\
        --instance demo --access-key-id my-id            # secret: --access-key-secret or
                                                         # $CDC_TABLESTORE_ACCESS_KEY_SECRET
    cdc server tablestore split --endpoint http://127.0.0.1:8500 --table orders
    cdc server tablestore merge --endpoint http://127.0.0.1:8500 --table orders

or in Python: :class:`LocalTablestore` (in-process thread), :class:`TablestoreProcess` (child process,
kill/restart), :class:`AdminClient` (split, merge, faults). The real ``tablestore.OTSClient`` and the
project's tunnel client talk to it at ``http://host:port``.

**Table API** (``table_store_pb2`` messages, PlainBuffer rows both ways): CreateTable, DescribeTable,
ListTable, DeleteTable, PutRow, UpdateRow (put / delete one version / delete all versions /
increment), DeleteRow, BatchWriteRow (<= 200 rows, per-row results), GetRow, GetRange (forward and
backward, ``limit``, ``next_start_primary_key``), row-existence conditions and column conditions/filters
(single and composite), auto-increment primary keys, ``ReturnType.RT_PK``. One version per cell is kept
(``max_versions`` is stored, not enforced); TTL is not enforced.

**Tunnel API** (``/tunnel/create|list|describe|delete|connect|heartbeat|shutdown|getcheckpoint|
readrecords|checkpoint``, messages of :mod:`cdc.backends.tablestore.tunnel_pb`):

* tunnel types ``BaseData``, ``Stream``, ``BaseAndStream``; stages ``ProcessBaseData`` then
  ``ProcessStream`` (a ``Stream`` tunnel starts in ``ProcessStream``; ``BaseAndStream`` switches once
  every base-data channel checkpointed ``"finished"``);
* base-data channels (type ``BaseData``, id ``<shard>-base``): one per open shard at creation, reading a
  snapshot of that shard's rows taken at creation, as ``PUT_ROW`` records without sequence info; stream
  channels (type ``Stream``, id = shard id): a shard's change log from the tunnel's creation (or from the
  shard's start for shards opened later), records with the sequence-info extension ``(epoch=1,
  timestamp=commit micros, row_index)``; ``PUT_ROW`` = the written cells (with timestamps),
  ``UPDATE_ROW`` = put cells plus ``DELETE_ONE_VERSION``/``DELETE_ALL_VERSION`` cells (an increment is
  logged as a put of the resulting value), ``DELETE_ROW`` = primary key plus the delete marker;
* channel status in DescribeTunnel: ``WAIT`` (a parent's checkpoint is not ``"finished"``), ``OPEN``
  (held by a live client), ``CLOSE`` (readable, held by nobody), ``TERMINATED`` (its checkpoint is
  ``"finished"``). ReadRecords and Checkpoint on a ``WAIT`` channel fail with ``OTSPermissionDenied``;
* heartbeat hands every free readable channel to the calling client (status ``OPEN``, version bumped),
  releases those it reports ``CLOSE``/``TERMINATED``, and reports a finished channel once as
  ``TERMINATED``; ReadRecords accepts any live client of the tunnel for any non-``WAIT`` channel;
  Checkpoint needs the channel's owner, or a channel with no live owner (it then becomes the caller's);
* tokens: ``base64(Token{version=1, content=TokenContent{iterator="<channel>:<position>"}})``; a read
  returns at most ``--max-records-per-read`` records (and about 4 MiB) after the token's position; ``next_token`` names the
  position after the last returned record (the same token when none), or is ``"finished"`` when the
  returned records reach the end of a sealed channel (a closed shard, or a snapshot). Re-reading a token
  returns the same records (or more, if the first read stopped at the head of a live shard);
* checkpoints: ``sequence_number`` must be the stored one plus one (``OTSSequenceNumberNotMatch``); the
  token must be a token of that channel, or ``"finished"`` for a sealed channel (``OTSParameterInvalid``);
* clients expire ``ClientConfig.timeout`` seconds (default 300) after their last call; any call by an
  expired or unknown client fails with ``OTSResourceGone`` and its channels are freed;
* change logs are kept until an admin ``trim`` (what stream expiration does): reading a stream channel
  from a position inside the trimmed part fails as the service fails it (HTTP 400, code
  ``OTSTunnelServerUnavailable``, message starting ``OTSTrimmedDataAccess``) and the channel's
  ``start_token`` moves to the first record still held; a BaseAndStream tunnel still in its base-data
  stage whose stream log loses records expires: ``expired`` in Describe/ListTunnel, and Connect and
  every client call fail with ``OTSTunnelExpired`` (delete it and create another).

**Lineage, which the public protocol lacks**: DescribeTunnel's ``ChannelInfo`` carries three extension
fields (numbers >= 100, so clients of the real service skip them; see :mod:`~cdc.backends.tablestore.tunnel_pb`):
``parent_channel_ids`` (the channels of the shards this one was split or merged from; for the first
stream channels of a ``BaseAndStream`` tunnel, every base-data channel), ``start_token`` (the token at
which the channel's log begins) and ``sealed`` (no record will ever be appended).

**Partitions**: a table starts with one shard covering every key. ``split`` seals an open shard and opens
two children (split point: ``split_key``, the leading primary-key values, or the shard's median row);
``merge`` seals two adjacent open shards and opens one child. Every ``Stream``/``BaseAndStream`` tunnel
that has the parent channels gets the child channels, in ``WAIT`` until the parents are finished.

**Auth**: requests must carry the signature-v2 headers the SDK sends (``x-ots-signature`` = HMAC-SHA1 of
the canonical request); a wrong key id or signature gets HTTP 403 ``OTSAuthFailed``. Responses carry
``x-ots-contentmd5``, ``x-ots-requestid``, ``x-ots-date``, ``x-ots-contenttype`` and ``Authorization:
OTS <id>:<signature>`` as the SDK checks them. Admin endpoints (``POST /admin/split|merge|shards|fault|
expire-client|trim``, JSON bodies) need ``x-cdc-admin-date`` (Unix seconds, at most 15 minutes off the
server's clock) and ``x-cdc-admin-signature`` = ``base64(HMAC-SHA1(secret, path + "\\n" + date + "\\n" +
body))`` (:mod:`.admin`); ``GET /admin/health`` is open. Listening beyond loopback with the default secret
logs a warning.

**Limits and hardening**: the service's documented limits (names, 1 KB primary-key values, 2 MB
attribute values, 4 MB writes, GetRange ``limit`` >= 1...) are enforced with the service's error codes,
a body over the service's 5 MiB request limit is refused unread, idle connections close after
``--idle-timeout`` (60 s), at most ``--max-connections`` (64) are served at once: see ``README.md`` in
this package for the table of limits with their sources, and what happens to each kind of bad input.

**Durability**: one sqlite database (WAL) in the data directory; an acknowledged write survives
``kill -9``. Tunnel clients are stored too, so they survive a restart until they time out.

**Faults** (admin ``fault``, for tests): ``unavailable`` (HTTP 503 ``OTSServerUnavailable`` /
``OTSTunnelServerUnavailable``), ``drop`` (the connection is closed without an answer), ``delay``
(``seconds`` before serving); for the next ``count`` requests (-1: until cleared) whose path starts with
``path_prefix``. Admin calls are never faulted.
"""

from typing import TYPE_CHECKING, Any

from cdc.servers.ports import free_port

from .admin import AdminClient
from .process import TablestoreProcess

if TYPE_CHECKING:
    from .server import LocalTablestore

__all__ = ["AdminClient", "LocalTablestore", "TablestoreProcess", "free_port"]


def __getattr__(name: str) -> Any:
    """``LocalTablestore`` loads on first use: it needs the protobuf runtime (the ``tablestore`` extra), which
    ``cdc server tablestore --help`` and the admin client do not."""
    if name == "LocalTablestore":
        from cdc.errors import requires_extra

        with requires_extra("tablestore", "the local Tablestore server"):
            from .server import LocalTablestore

        return LocalTablestore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
