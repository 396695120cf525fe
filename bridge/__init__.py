"""chatbridge: team chat (Matrix, Slack, console) to the ``claude -p`` CLI."""

__version__ = "0.1.0"
