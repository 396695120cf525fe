"""Slack transport: slack-bolt over Socket Mode or the HTTP Events API.

:class:`SlackTransport` is the transport; :class:`SlackSettings` is the
``[slack]`` section of the configuration.

The transport class is imported on first use: the configuration imports
only the settings, and importing the chat library costs seconds at startup.
"""

from typing import TYPE_CHECKING

from transports.slack.settings import SlackSettings

if TYPE_CHECKING:
    from transports.slack.transport import SlackTransport


def __getattr__(name: str) -> object:
    if name == "SlackTransport":
        from transports.slack.transport import SlackTransport

        return SlackTransport
    raise AttributeError(name)


__all__ = ["SlackSettings", "SlackTransport"]
