"""A stdio MCP server that takes ``argv[1]`` seconds (default 1) to start, then
answers just enough MCP (initialize, tools/list, ping) for claude to connect.
For bench_prestart: a slow MCP server is what makes claude's start-up slow."""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
    for raw in sys.stdin:
        message = json.loads(raw)
        if "id" not in message:
            continue  # a notification
        method = message.get("method")
        result: dict[str, object] = {}
        if method == "initialize":
            result = {
                "protocolVersion": message.get("params", {}).get("protocolVersion", "2024-11-05"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "slow", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": []}
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
