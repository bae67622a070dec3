"""SCD type 2 back-fill: a late change (not newer than its key's head) is placed into the key's history.

:func:`sinks.delta.scd2.stage_scd2` hands the keys with a late change here, with every change of theirs in
the batch and their stored versions (:func:`late_keys` tells which keys; only those read their history). Per
key, the changes are walked in sequence order against the stored versions:

* A late change falls into the version valid at its sequence (``_valid_from <= seq < _valid_to``), or into a
  gap (before the key's first version, or after a delete).
* An upsert into a version that changes a tracked column splits it: the version ends at the late change, and
  the late change is a version valid until the split version's old end. If the split version was changed in
  place after the late change (its ``sequence_by`` is later), the split version resumes at that change
  (three pieces); the piece before the late change keeps the version's values and ``sequence_by`` (those of
  its last change, which may now lie after its ``_valid_to``: the table keeps no earlier values). A partial change (``_unchanged``, ``ignore_null_updates``) takes the columns it does not set
  from the version it splits. One that changes no tracked column updates the version in place when it is
  later than the version's last change, else changes nothing.
* A delete into a version closes it at the delete's sequence; the versions after it remain.
* An upsert into a gap opens a version valid until the next version's start (or the tombstone's delete).
* A new version whose tracked columns equal those of the version right after it is one version with it (as
  in-order delivery would have made them).
* A change at the sequence of a stored change (a version's start, its last in-place change, or a delete)
  with the same values is a redelivery and changes nothing; with different values it fails the batch
  naming the key and the columns.

The changes newer than the head are then walked as :func:`sinks.delta.scd2.stage_scd2` walks them. The
result is the MERGE source of the key's changed versions: ``reshape`` (a stored version's validity and
sequence change, its values stay), ``replace`` (a stored version's values, validity and sequence change) and
``open`` (a version is inserted); a reshaped or replaced version is matched by its stored ``_valid_from``
(``__cdc_at``).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc.errors import MalformedRecordError
from cdc.model import COMMIT_TS
from sinks.delta.batch import join_left
from sinks.delta.layout import (
    ACTION,
    AT,
    DELETED_AT,
    FROM,
    IS_DELETE,
    NOW,
    SET_PREFIX,
    TO,
    VALID_FROM,
    VALID_TO,
)
from sinks.delta.sequence import _same, greater, order_key, tie_error
from sinks.delta.spec import SinkSpec

#: The sequence columns compared in Python, as :func:`sinks.delta.sequence.order_key` orders them.
_ORD = "__cdc_ord_"


def late_mask(spec: SinkSpec, prepared: pa.Table, heads: pa.Table) -> pa.Array:
    """Per row of ``prepared``: its key has a change of the batch not newer than the key's head."""
    seq = spec.sequence_by
    h = heads.select([*spec.keys, seq]).rename_columns([*spec.keys, "__cdc_h"])
    joined = join_left(prepared.select([*spec.keys, seq]), h, spec.keys)
    h_seq = joined.column("__cdc_h").cast(prepared.schema.field(seq).type)
    late = pc.fill_null(pc.and_kleene(pc.is_valid(h_seq), pc.invert(greater(joined.column(seq), h_seq))), False)
    if not pc.any(late).as_py():
        return late
    keys = joined.select(list(spec.keys)).filter(late).group_by(list(spec.keys)).aggregate([])
    marked = join_left(prepared.select(list(spec.keys)), keys.append_column("__cdc_l", pa.repeat(True, keys.num_rows)),
                       spec.keys)
    return pc.fill_null(marked.column("__cdc_l"), False).combine_chunks()


def late_keys(spec: SinkSpec, prepared: pa.Table, heads: pa.Table) -> pa.Table:
    """The keys whose history the batch reads: those with a change not newer than their head."""
    late = late_mask(spec, prepared, heads)
    return prepared.select(list(spec.keys)).filter(late).group_by(list(spec.keys)).aggregate([])


def _ords(table: pa.Table, names: list[str]) -> dict[str, list[Any]]:
    return {n: order_key(table.column(n)).to_pylist() for n in names if n in table.column_names}


def stage_late(spec: SinkSpec, rows: pa.Table, heads: pa.Table, history: pa.Table, tracked: list[str],
               out_schema: pa.Schema) -> pa.Table:
    """The MERGE source (of ``out_schema`` plus ``__cdc_at``) for the keys of ``rows``: every change of the
    batch of keys with a late change (prepared: sorted by key and sequence), ``heads`` the key heads
    (:func:`sinks.delta.scd2.key_heads`) and ``history`` the keys' stored versions."""
    seq = spec.sequence_by
    keys = list(spec.keys)
    h = heads.select([*keys, seq]).rename_columns([*keys, f"__h_{seq}"])
    rows = join_left(rows, h, keys)
    rows = rows.set_column(rows.num_columns - 1, f"__h_{seq}", rows.column(f"__h_{seq}").cast(rows.schema.field(seq).type))
    values = [c for c in out_schema.names if c not in keys and c not in (seq, IS_DELETE, NOW, ACTION, FROM, TO)]
    sets = [c for c in rows.column_names if c.startswith(SET_PREFIX)]
    ch_rows = rows.to_pylist()
    ch_ord = _ords(rows, [seq, f"__h_{seq}", *sets])
    hist = history.to_pylist()
    hist_ord = _ords(history, [VALID_FROM, VALID_TO, seq])
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for i, r in enumerate(hist):
        v = {"from": r[VALID_FROM], "to": r[VALID_TO], "f": hist_ord[VALID_FROM][i], "t": hist_ord[VALID_TO][i],
             "row": {c: r.get(c) for c in values}}
        v["seq"], v["s"] = (r[seq], hist_ord[seq][i]) if seq in hist_ord and r.get(seq) is not None else (None, None)
        by_key.setdefault(tuple(r[k] for k in keys), []).append(v)
    # Only the late keys' heads become Python values (the batch's heads are every key it touches).
    late_heads = join_left(rows.select(keys), heads.select([*keys, DELETED_AT]), keys)
    tombs = dict(zip(zip(*(late_heads.column(k).to_pylist() for k in keys), strict=True),
                     pc.is_valid(late_heads.column(DELETED_AT)).to_pylist(), strict=True))
    now = ch_rows[0][NOW] if ch_rows else None
    out: list[dict[str, Any]] = []
    i, n = 0, len(ch_rows)
    while i < n:
        key = tuple(ch_rows[i][k] for k in keys)
        j = i
        while j < n and tuple(ch_rows[j][k] for k in keys) == key:
            j += 1
        walk = _Walk(spec, key, by_key.get(key, []), tombs.get(key, False), ch_rows[i][f"__h_{seq}"],
                     ch_ord[f"__h_{seq}"][i], tracked, values)
        for r in range(i, j):
            ch = ch_rows[r]
            own = [c for c in values if SET_PREFIX + c not in sets
                   or ch_ord[SET_PREFIX + c][r] == ch_ord[seq][r]]
            if ch_ord[seq][r] <= walk.h:
                walk.late(ch, ch_ord[seq][r], own)
            else:
                newer = [c for c in values if SET_PREFIX + c not in sets or (
                    ch_ord[SET_PREFIX + c][r] is not None and ch_ord[SET_PREFIX + c][r] > walk.h)]
                walk.fresh(ch, ch_ord[seq][r], newer)
        for action, v in walk.actions():
            row = {**dict(zip(keys, key, strict=True)), **v["row"], seq: v["seq"], IS_DELETE: False, NOW: now,
                   ACTION: action, FROM: v["from"], TO: v["to"], AT: v.get("at")}
            out.append(row)
        i = j
    schema = out_schema.append(pa.field(AT, out_schema.field(FROM).type))
    return pa.Table.from_pylist(out, schema=schema)


class _Walk:
    """One key's versions while its batch is walked (see the module docstring)."""

    def __init__(self, spec: SinkSpec, key: tuple[Any, ...], versions: list[dict[str, Any]], tomb: bool,
                 head: Any, h: Any, tracked: list[str], values: list[str]) -> None:
        self.spec, self.key, self.tomb, self.head, self.h = spec, key, tomb, head, h
        self.tracked, self.values = tracked, values
        self.versions = sorted(versions, key=lambda v: v["f"])
        for v in self.versions:
            if v["s"] is None:  # the sequence column is hidden: the current version's last change is the head's
                v["seq"], v["s"] = (head, h) if v["t"] is None else (v["from"], v["f"])
            v["at"], v["af"] = v["from"], v["f"]  # matched by its stored valid-from
        self.stored = {v["af"]: _frozen(v) for v in self.versions}
        current = [v for v in self.versions if v["t"] is None]
        #: the head's values: the current version's as stored (late changes never change them)
        self.head_row = None if tomb or not current else dict(current[0]["row"])

    # ------------------------------------------------------------------ finding
    def _at(self, q: Any) -> dict[str, Any] | None:
        for v in self.versions:
            if v["f"] <= q and (v["t"] is None or q < v["t"]):
                return v
        return None

    def _next(self, q: Any) -> dict[str, Any] | None:
        return next((v for v in self.versions if v["f"] > q), None)

    def _deleted_at(self, q: Any) -> bool:
        """A stored delete at ``q``: a version ends there and none starts there, or the tombstone's."""
        if self.tomb and q == self.h:
            return True
        ends = any(v["t"] == q for v in self.versions)
        return ends and not any(v["f"] == q for v in self.versions)

    def _same_tracked(self, a: dict[str, Any], b: dict[str, Any]) -> bool:
        return all(_same(a.get(c), b.get(c)) for c in self.tracked)

    def _tie(self, ch: dict[str, Any], differ: list[str]) -> MalformedRecordError:
        return tie_error(ch, self.spec.keys, self.spec.sequence_by, differ, "the table's history holds a change at "
                         "that sequence")

    def _insert(self, v: dict[str, Any]) -> None:
        """Add version ``v``, or extend the version right after it when their tracked columns are equal."""
        nxt = self._next(v["f"])
        if nxt is not None and v["t"] is not None and nxt["f"] == v["t"] and self._same_tracked(v["row"], nxt["row"]):
            nxt.update({"from": v["from"], "f": v["f"]})
            return
        self.versions.append(v)
        self.versions.sort(key=lambda x: x["f"])

    def _row(self, ch: dict[str, Any], own: list[str], base: dict[str, Any] | None) -> dict[str, Any]:
        return {c: ch.get(c) if c in own else (base or {}).get(c) if c != COMMIT_TS else ch.get(c)
                for c in self.values}

    # ------------------------------------------------------------------ changes
    def late(self, ch: dict[str, Any], q: Any, own: list[str]) -> None:
        seq = self.spec.sequence_by
        delete = bool(ch[IS_DELETE])
        x = self._at(q)
        if x is None:  # a gap: before the first version, or after a delete
            if self._deleted_at(q):
                if not delete:
                    raise self._tie(ch, ["_op"])
                return
            if delete:
                return
            nxt = self._next(q)
            end, e = (nxt["from"], nxt["f"]) if nxt is not None else (self.head, self.h) if self.tomb else (None, None)
            self._insert({"from": ch[seq], "f": q, "to": end, "t": e, "seq": ch[seq], "s": q,
                          "row": self._row(ch, own, None)})
            return
        if q == x["f"] or q == x["s"]:  # a stored change's sequence: a redelivery, or a tie
            if delete:
                raise self._tie(ch, ["_op"])
            compared = [c for c in own if c != COMMIT_TS and (q == x["s"] or c in self.tracked)]
            differ = [c for c in compared if not _same(ch.get(c), x["row"].get(c))]
            if differ:
                raise self._tie(ch, differ)
            return
        # Changed in place after q: the version resumes at its last change (unless that lies past its end:
        # a piece of a version split before, whose values are its last change's).
        resumes = q < x["s"] and (x["t"] is None or x["s"] < x["t"])
        tail = {"from": x["seq"], "f": x["s"], "to": x["to"], "t": x["t"], "seq": x["seq"], "s": x["s"],
                "row": dict(x["row"])} if resumes else None
        if delete:
            x.update({"to": ch[seq], "t": q})
            if tail is not None:
                self.versions.append(tail)
                self.versions.sort(key=lambda v: v["f"])
            return
        row = self._row(ch, own, x["row"])
        if self._same_tracked(row, x["row"]):
            if q > x["s"]:  # later than the version's last change: in place
                x.update({"row": row, "seq": ch[seq], "s": q})
            return
        new = {"from": ch[seq], "f": q, "to": x["to"], "t": x["t"], "seq": ch[seq], "s": q, "row": row}
        x.update({"to": ch[seq], "t": q})
        if tail is not None:
            new.update({"to": tail["from"], "t": tail["f"]})
            self.versions.append(tail)
            self.versions.sort(key=lambda v: v["f"])
        self._insert(new)

    def fresh(self, ch: dict[str, Any], q: Any, newer: list[str]) -> None:
        """A change newer than the head, as :func:`sinks.delta.scd2.stage_scd2` applies it: the columns no
        change of the batch newer than the head set are the head's (the current version's; none after a
        delete)."""
        seq = self.spec.sequence_by
        last = self.versions[-1] if self.versions else None
        open_ = last if last is not None and last["t"] is None else None
        if ch[IS_DELETE]:
            if open_ is not None:
                open_.update({"to": ch[seq], "t": q})
            return
        row = self._row(ch, newer, self.head_row)
        if open_ is not None and self._same_tracked(row, open_["row"]):
            open_.update({"row": row, "seq": ch[seq], "s": q})
            return
        if open_ is not None:
            open_.update({"to": ch[seq], "t": q})
        self.versions.append({"from": ch[seq], "f": q, "to": None, "t": None, "seq": ch[seq], "s": q, "row": row})

    # ------------------------------------------------------------------ the result
    def actions(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for v in self.versions:
            if "af" not in v:
                out.append(("open", v))
                continue
            stored = self.stored[v["af"]]
            if _frozen(v) == stored:
                continue
            out.append(("reshape" if _values_equal(v["row"], stored[3]) else "replace", v))
        return out


def _frozen(v: dict[str, Any]) -> tuple[Any, ...]:
    return (v["f"], v["t"], v["s"], v["row"])


def _values_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(_same(a[c], b[c]) for c in a)
