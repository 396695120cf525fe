"""The project's exceptions.

::

    ChatbridgeError
    ├── ConfigError        invalid configuration (exit status 2)
    └── StartupError       a part could not start (store, transport)

Store, transport and runner errors live beside their interfaces
(``StoreError``, ``TransportError``) and are translated at the boundary.
"""


class ChatbridgeError(Exception):
    """Root of chatbridge's own errors."""


class ConfigError(ChatbridgeError):
    """The configuration is invalid; the message names every offending key."""


class StartupError(ChatbridgeError):
    """A part of the service could not start."""
