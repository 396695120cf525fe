"""One run's life: prepare its batch, start claude, follow it, end it once (docs/detached-
runs.md).
"""
