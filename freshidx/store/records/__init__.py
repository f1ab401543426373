"""Typed, versioned records of everything freshidx writes to the store: one model per record kind, each
read through its model (any known format, upgraded) and written by it (the current format only, tagged
``format_version``). Key layout: :mod:`freshidx.store.layout` (docs/architecture.md#object-store-layout).

========================  ==========================================================  =====================
record                    key                                                         model
========================  ==========================================================  =====================
pointer                   ``<root>/CURRENT`` (``indexes/<name>/`` or a bucket root)   :class:`Pointer`
history entry             ``<root>/history/<seq>.json``                                :class:`Pointer`
manifest                  ``<root>/versions/<v>/manifest.json``                        :class:`Manifest`
segment descriptor        inside a delta manifest's ``segments``                       :class:`Segment`
refusal                   ``<root>/refused/<v>.json``                                  :class:`Refusal`
ledger entry              ``ledger/<pipeline>/<date>/<trigger-id>.json``               :class:`LedgerEntry`
catch-up state            ``catchup/<asset>/STATE``                                    :class:`CatchupState`
continuous heartbeat      ``continuous/<pipeline>/heartbeat.json``                     :class:`Heartbeat`
runtime record            ``runtime/<name>.json``                                      :class:`RuntimeRecord`
quarantine line / marker  ``quarantine/<source>/<partition>/…``                        :class:`QuarantineLine`,
                                                                                       :class:`QuarantineDone`
========================  ==========================================================  =====================
"""

from freshidx.store.records.base import CURRENT_FORMAT, VERSION_KEY, Record, RecordError
from freshidx.store.records.index import Manifest, Pointer, Refusal
from freshidx.store.records.ledger_entry import LedgerEntry
from freshidx.store.records.progress import CatchupState, Heartbeat, RuntimeRecord
from freshidx.store.records.quarantine import QuarantineDone, QuarantineLine
from freshidx.store.records.segment import Segment

__all__ = [
    "CURRENT_FORMAT", "VERSION_KEY", "CatchupState", "Heartbeat", "LedgerEntry", "Manifest", "Pointer",
    "QuarantineDone", "QuarantineLine", "Record", "RecordError", "Refusal", "RuntimeRecord", "Segment",
]
