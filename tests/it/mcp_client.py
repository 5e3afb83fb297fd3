"""The official MCP Python SDK's client against the gateway's MCP server.

Driven by tests/it/mcp_server.rs. `LEMON_MCP_MODE` is `http` (Streamable
HTTP to `LEMON_MCP_URL` with the bearer token `LEMON_API_KEY`) or `stdio`
(the SDK starts `LEMON_GATEWAY_BIN mcp` itself, with this process's
environment). Prints one JSON object of what it saw; the Rust test checks it.
"""

import asyncio
import json
import os
import sys

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


def text_of(result):
    return "".join(getattr(block, "text", "") for block in result.content)


async def all_tools(client):
    names, cursor = [], None
    while True:
        page = await client.list_tools(cursor=cursor, cache_mode="bypass") if cursor else await client.list_tools(cache_mode="bypass")
        names.extend(tool.name for tool in page.tools)
        cursor = page.next_cursor
        if not cursor:
            return names


async def drive(client, out):
    out["server"] = client.server_info.name if client.server_info else None
    out["protocol"] = client.protocol_version
    out["list_changed"] = bool(client.server_capabilities.tools and client.server_capabilities.tools.list_changed)
    out["tools"] = await all_tools(client)

    ran = await client.call_tool("run", {"prompt": "hello from the mcp sdk", "engine": "echo"})
    out["run"] = {"is_error": bool(ran.is_error), "body": json.loads(text_of(ran))}
    run_id = out["run"]["body"]["run_id"]

    runs = await client.call_tool("runs", {"limit": 5})
    out["runs"] = json.loads(text_of(runs))
    status = await client.call_tool("status", {"run_id": run_id})
    out["status"] = json.loads(text_of(status))

    started = await client.call_tool("run", {"prompt": "one two three four five six seven eight", "engine": "echo", "wait": False})
    started_id = json.loads(text_of(started))["run_id"]
    cancelled = await client.call_tool("cancel", {"run_id": started_id})
    out["cancel"] = json.loads(text_of(cancelled))

    bad = await client.call_tool("run", {"prompt": 5})
    out["bad_argument"] = {"is_error": bool(bad.is_error), "text": text_of(bad)}
    try:
        await client.call_tool("no_such_tool", {})
        out["unknown_tool"] = None
    except MCPError as error:
        out["unknown_tool"] = {"code": error.error.code, "message": error.error.message}


async def main():
    mode = os.environ["LEMON_MCP_MODE"]
    out = {"mode": mode}
    if mode == "http":
        url = os.environ["LEMON_MCP_URL"]
        headers = {"Authorization": f"Bearer {os.environ['LEMON_API_KEY']}"}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                await drive(client, out)
        # A wrong token is refused.
        try:
            wrong = {"Authorization": "Bearer not-the-token"}
            async with httpx2.AsyncClient(headers=wrong, timeout=60) as http:
                async with Client(streamable_http_client(url, http_client=http)) as client:
                    await client.list_tools()
            out["wrong_token"] = "accepted"
        except BaseException as error:  # the SDK raises an exception group
            out["wrong_token"] = repr(error)
    else:
        server = StdioServerParameters(
            command=os.environ["LEMON_GATEWAY_BIN"],
            args=["mcp"],
            env={key: value for key, value in os.environ.items()},
        )
        async with Client(server) as client:
            await drive(client, out)
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except BaseException as error:
        print(f"mcp_client.py failed: {error!r}", file=sys.stderr)
        raise
