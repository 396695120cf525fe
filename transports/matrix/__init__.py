"""Matrix transport (matrix-nio, end-to-end encryption with vodozemac).

The transport class is imported on first use (:mod:`transports.lazy`): the configuration imports
only the settings, and importing the chat library costs seconds at startup.
"""

from typing import TYPE_CHECKING

from transports.lazy import on_first_use
from transports.matrix.settings import MatrixSettings

if TYPE_CHECKING:
    from transports.matrix.transport import MatrixTransport


__getattr__ = on_first_use("transports.matrix.transport", "MatrixTransport")

__all__ = ["MatrixSettings", "MatrixTransport"]
