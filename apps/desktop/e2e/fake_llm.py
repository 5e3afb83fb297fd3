#!/usr/bin/env python3
"""A fake OpenAI-compatible model for the desktop end-to-end test, on 127.0.0.1.

POST /v1/chat/completions streams (Server-Sent Events) a call of the `bash`
tool running the command of the first `COMMAND <…>` of the last user
message; once the request carries that call's result, it answers "Done."
and the result. Prints its port on stdout once it listens.
Usage: fake_llm.py
"""

import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def chunk(delta, finish=None):
    body = {"id": "chatcmpl-e2e", "object": "chat.completion.chunk", "created": 1700000000,
            "model": "e2e-model", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if not self.path.endswith("/chat/completions"):
            self.send_error(404)
            return
        messages = request.get("messages", [])
        # This turn: what follows the last user message (a resumed session
        # carries the earlier turns too).
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        tool_results = [m for m in messages[last_user + 1:] if m.get("role") == "tool"]
        if tool_results:
            content = tool_results[-1].get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            frames = [chunk({"role": "assistant", "content": "Done. " + text.strip()}), chunk({}, "stop")]
        else:
            users = [m for m in messages if m.get("role") == "user"]
            prompt = users[-1].get("content", "") if users else ""
            prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
            found = re.search(r"COMMAND <([^>]*)>", prompt)
            command = found.group(1) if found else "true"
            call = {"index": 0, "id": "call_e2e", "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
            frames = [chunk({"role": "assistant", "tool_calls": [call]}), chunk({}, "tool_calls")]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for frame in frames + ["data: [DONE]\n\n"]:
            self.wfile.write(frame.encode())
            self.wfile.flush()


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
