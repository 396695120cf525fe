"""Replicas on one database: leases, the Matrix leader, paused holders, status
(docs/replicas.md).
"""
