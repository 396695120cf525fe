"""Slack transport: slack-bolt over Socket Mode or the HTTP Events API.

:class:`SlackTransport` is the transport; :class:`SlackSettings` is the
``[slack]`` section of the configuration.

The transport class is imported on first use (:mod:`transports.lazy`): the configuration imports
only the settings, and importing the chat library costs seconds at startup.
"""

from typing import TYPE_CHECKING

from transports.lazy import on_first_use
from transports.slack.settings import SlackSettings

if TYPE_CHECKING:
    from transports.slack.transport import SlackTransport


__getattr__ = on_first_use("transports.slack.transport", "SlackTransport")

__all__ = ["SlackSettings", "SlackTransport"]
