"""Matrix transport (matrix-nio, end-to-end encryption with vodozemac).

The transport class is imported on first use: the configuration imports
only the settings, and importing the chat library costs seconds at startup.
"""

from typing import TYPE_CHECKING

from transports.matrix.settings import MatrixSettings

if TYPE_CHECKING:
    from transports.matrix.transport import MatrixTransport


def __getattr__(name: str) -> object:
    if name == "MatrixTransport":
        from transports.matrix.transport import MatrixTransport

        return MatrixTransport
    raise AttributeError(name)


__all__ = ["MatrixSettings", "MatrixTransport"]
