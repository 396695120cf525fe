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


def reason(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name when it has none.

    Some failures carry no text at all (a bare ``TimeoutError``): a line
    ending in "failed: " tells the operator nothing.
    """
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
