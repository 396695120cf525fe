"""The durable store on SQLAlchemy: SQLite or PostgreSQL.

:class:`SqlStore` is one mixin per role of :class:`~bridge.store.base.Store`
(``messages``, ``runs``, ``live_runs``, ``outbox``, ``rooms``, ``ledger``,
``approvals``, ``tool_rules``, ``audit``, ``marks``) over :mod:`.shared`'s
transactions and queries, with the row mappers in :mod:`.rows`. Every public
method is one short transaction; every SQLAlchemy or driver error leaves as
:class:`~bridge.store.base.StoreError`, cancellation propagates untouched.
Which commits are synced and which share a transaction: docs/operations.md,
"How the store writes".
"""

from bridge.store.sql.messages import ACCEPT_GROUP_LIMIT
from bridge.store.sql.outbox import ENTRY_GROUP_LIMIT
from bridge.store.sql.runs import FINISH_GROUP_LIMIT
from bridge.store.sql.store import SqlStore

__all__ = ["ACCEPT_GROUP_LIMIT", "ENTRY_GROUP_LIMIT", "FINISH_GROUP_LIMIT", "SqlStore"]
