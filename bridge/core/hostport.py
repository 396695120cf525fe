"""``host:port``: where a listener binds, parsed once for every listener.

IPv6 addresses go in brackets (``[::1]:8080``): without them the last colon
could belong to the address. Port 0 means any free port.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler
    from pydantic_core import CoreSchema

_FORM = "must be host:port, e.g. 127.0.0.1:8080 or [::1]:8080"


@dataclass(frozen=True)
class HostPort:
    """A host (name, IPv4 or bare IPv6 address) and a port.

    Settings fields of this type take the ``host:port`` text and print as it.
    """

    host: str
    port: int

    def __post_init__(self) -> None:
        if not self.host or not 0 <= self.port <= 65535:
            raise ValueError(_FORM)

    @classmethod
    def parse(cls, text: str) -> HostPort:
        """``"127.0.0.1:8080"``, ``"localhost:0"``, ``"[::1]:8080"``; ValueError otherwise."""
        host, sep, port = text.strip().rpartition(":")
        if not sep or not (port.isascii() and port.isdigit()):
            raise ValueError(_FORM)
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
            if ":" not in host:
                raise ValueError(_FORM)
        elif ":" in host or "[" in host or "]" in host:
            raise ValueError(f"{_FORM} (IPv6 addresses in brackets)")
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source_type: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        # Imported here so the core layer needs pydantic only where settings use it.
        from pydantic_core import core_schema

        def from_text(value: str) -> HostPort:
            return cls.parse(value)

        return core_schema.json_or_python_schema(
            json_schema=core_schema.no_info_after_validator_function(
                from_text, core_schema.str_schema()
            ),
            python_schema=core_schema.union_schema(
                [
                    core_schema.is_instance_schema(cls),
                    core_schema.no_info_after_validator_function(
                        from_text, core_schema.str_schema()
                    ),
                ]
            ),
            serialization=core_schema.to_string_ser_schema(),
        )
