"""The machine chatbridge runs on: preflight checks, locks, containment, HTTP, logs."""
