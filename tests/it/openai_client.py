"""Drives the gateway's OpenAI-compatible API with the official `openai` client.

Started by openai_e2e.rs with LEMON_BASE_URL (`http://127.0.0.1:<port>/v1`) and
LEMON_API_KEY; prints one JSON object of what the client saw.
"""

import json
import os

import openai
from openai import OpenAI

base_url = os.environ["LEMON_BASE_URL"]
api_key = os.environ["LEMON_API_KEY"]
client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
out = {"version": openai.__version__}

out["models"] = [model.id for model in client.models.list()]


def user(text):
    return [{"role": "user", "content": text}]


completion = client.chat.completions.create(model="echo", messages=user("hello from python"))
choice = completion.choices[0]
out["chat"] = {
    "content": choice.message.content,
    "role": choice.message.role,
    "finish_reason": choice.finish_reason,
    "object": completion.object,
}

stream = client.chat.completions.create(
    model="echo",
    messages=user("streamed from python"),
    stream=True,
    stream_options={"include_usage": True},
)
pieces, roles, finish = [], [], None
for chunk in stream:
    if not chunk.choices:
        continue
    delta = chunk.choices[0].delta
    if delta.role:
        roles.append(delta.role)
    if delta.content:
        pieces.append(delta.content)
    finish = chunk.choices[0].finish_reason or finish
out["chat_stream"] = {"text": "".join(pieces), "roles": roles, "finish_reason": finish}

response = client.responses.create(model="echo", input="a response")
out["response"] = {"output_text": response.output_text, "status": response.status}

events = client.responses.create(model="echo", input="a streamed response", stream=True)
types, text, completed_text = [], "", None
for event in events:
    types.append(event.type)
    if event.type == "response.output_text.delta":
        text += event.delta
    elif event.type == "response.completed":
        completed_text = event.response.output_text
out["response_stream"] = {
    "first": types[0],
    "last": types[-1],
    "text": text,
    "completed_text": completed_text,
}

with client.responses.stream(model="echo", input="the stream helper") as helper:
    for _ in helper:
        pass
    out["response_helper"] = helper.get_final_response().output_text

claude = client.chat.completions.create(model="claude", messages=user("how many tests?"))
out["claude"] = {
    "content": claude.choices[0].message.content,
    "usage": claude.usage.model_dump(exclude_none=True),
}
pieces = []
for chunk in client.chat.completions.create(
    model="claude", messages=user("how many tests?"), stream=True
):
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
out["claude_stream"] = "".join(pieces)

try:
    client.chat.completions.create(model="nonesuch", messages=user("hi"))
    out["unknown_model"] = "accepted"
except openai.BadRequestError as error:
    out["unknown_model"] = {"status": error.status_code, "code": error.code, "type": error.type}

try:
    OpenAI(base_url=base_url, api_key="wrong-key", max_retries=0).models.list()
    out["bad_key"] = "accepted"
except openai.AuthenticationError as error:
    out["bad_key"] = {"status": error.status_code, "code": error.code}

pieces = []
try:
    for chunk in client.chat.completions.create(
        model="codex", messages=user("fix it"), stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    out["failed_stream"] = {"error": None, "text": "".join(pieces)}
except openai.APIError as error:
    out["failed_stream"] = {"error": type(error).__name__, "text": "".join(pieces)}

print(json.dumps(out))
