// The bridge's own handling, with the SDK's objects mocked: `node --test bridges/xmtp/`.

import { test } from "node:test";
import assert from "node:assert/strict";
import { PassThrough } from "node:stream";
import { mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { runBridge, MAX_LINE_BYTES, remoteAttachmentFields } from "./lib.mjs";

const ME = "1nb0x";

/** A conversation as the SDK gives it: an id, sendText, messages. */
function fakeConversation(id, { history = [], failSend = null } = {}) {
  return {
    id,
    sent: [],
    async sendText(text) {
      if (failSend) throw new Error(failSend);
      this.sent.push(text);
      return `msg-${this.sent.length}`;
    },
    async messages({ sentAfterNs }) {
      return history.filter((m) => m.sentAtNs > sentAfterNs);
    },
  };
}

/** An Agent as the SDK gives it: events, start/stop, a client with conversations. */
function fakeAgent(conversations) {
  const handlers = new Map();
  return {
    address: "0xabc",
    started: false,
    stopped: false,
    synced: 0,
    on(event, handler) {
      handlers.set(event, handler);
    },
    emit(event, value) {
      handlers.get(event)?.(value);
    },
    async start() {
      this.started = true;
    },
    async stop() {
      this.stopped = true;
    },
    client: {
      inboxId: ME,
      conversations: {
        async getConversationById(id) {
          return conversations.find((c) => c.id === id);
        },
        async syncAll() {},
        async list() {
          return conversations;
        },
      },
    },
  };
}

function textMessage(id, sender, content, sentAtNs, conversationId = "conv-1") {
  return { id, senderInboxId: sender, content, sentAtNs, conversationId };
}

/** Starts a bridge on `agent`; the gateway's side: write lines, read lines. */
async function harness(agent, env = {}) {
  const input = new PassThrough();
  const lines = [];
  let waiters = [];
  const output = {
    write(text) {
      for (const line of text.split("\n").filter(Boolean)) lines.push(JSON.parse(line));
      waiters = waiters.filter((w) => !w());
    },
  };
  const logs = [];
  const done = runBridge({
    createAgent: async (seen) => {
      agent.env = seen;
      return agent;
    },
    input,
    output,
    env,
    log: (m) => logs.push(m),
  });
  const waitFor = (predicate) =>
    new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`timed out; got ${JSON.stringify(lines)}`)), 5000);
      const check = () => {
        const found = lines.find(predicate);
        if (found) {
          clearTimeout(timer);
          resolve(found);
          return true;
        }
        return false;
      };
      if (!check()) waiters.push(check);
    });
  const send = (value) => input.write((typeof value === "string" ? value : JSON.stringify(value)) + "\n");
  return { input, lines, logs, done, waitFor, send };
}

test("says ready with its inbox id and address once the agent started", async () => {
  const agent = fakeAgent([]);
  const h = await harness(agent, { XMTP_ENV: "production" });
  const ready = await h.waitFor((l) => l.type === "ready");
  assert.deepEqual(ready, { v: 1, type: "ready", inbox_id: ME, address: "0xabc", env: "production" });
  assert.equal(agent.started, true);
  assert.equal(agent.env.XMTP_ENV, "production");
  h.input.end();
  await h.done;
  assert.equal(agent.stopped, true);
});

test("hands a text message over and skips its own and non-text ones", async () => {
  const agent = fakeAgent([]);
  const h = await harness(agent);
  await h.waitFor((l) => l.type === "ready");
  agent.emit("text", { message: textMessage("m-own", ME, "mine", 1n), conversation: { id: "conv-1" } });
  agent.emit("text", { message: textMessage("m-obj", "s1", { not: "text" }, 2n), conversation: { id: "conv-1" } });
  agent.emit("text", { message: textMessage("m-1", "s1", "hello", 3_000_000n), conversation: { id: "conv-1" } });
  const message = await h.waitFor((l) => l.type === "message");
  assert.deepEqual(message, {
    v: 1, type: "message", id: "m-1", conversation_id: "conv-1", sender: "s1", text: "hello", sent_at_ms: 3,
  });
  assert.equal(h.lines.filter((l) => l.type === "message").length, 1);
  h.input.end();
  await h.done;
});

test("sends a text, answers sent, and does not send the same request twice", async () => {
  const conversation = fakeConversation("conv-1");
  const agent = fakeAgent([conversation]);
  const h = await harness(agent);
  await h.waitFor((l) => l.type === "ready");
  h.send({ v: 1, type: "send", request_id: "r1", conversation_id: "conv-1", text: "the answer" });
  const sent = await h.waitFor((l) => l.type === "sent");
  assert.deepEqual(sent, { v: 1, type: "sent", request_id: "r1", message_id: "msg-1" });
  h.send({ v: 1, type: "send", request_id: "r1", conversation_id: "conv-1", text: "the answer" });
  h.send({ v: 1, type: "ping", id: "p" });
  await h.waitFor((l) => l.type === "pong");
  assert.equal(h.lines.filter((l) => l.type === "sent").length, 2);
  assert.deepEqual(conversation.sent, ["the answer"]);
  h.input.end();
  await h.done;
});

test("a send to an unknown conversation or that the SDK refuses is an error for its request", async () => {
  const agent = fakeAgent([fakeConversation("conv-down", { failSend: "network down" })]);
  const h = await harness(agent);
  await h.waitFor((l) => l.type === "ready");
  h.send({ v: 1, type: "send", request_id: "r-x", conversation_id: "nowhere", text: "t" });
  const unknown = await h.waitFor((l) => l.type === "error" && l.request_id === "r-x");
  assert.equal(unknown.retry, false);
  h.send({ v: 1, type: "send", request_id: "r-y", conversation_id: "conv-down", text: "t" });
  const refused = await h.waitFor((l) => l.type === "error" && l.request_id === "r-y");
  assert.deepEqual(refused, { v: 1, type: "error", request_id: "r-y", message: "network down", retry: true });
  h.send({ v: 1, type: "send", request_id: "r-z" });
  const malformed = await h.waitFor((l) => l.type === "error" && l.request_id === "r-z");
  assert.equal(malformed.retry, false);
  h.input.end();
  await h.done;
});

test("garbage, other versions, unknown types and oversized lines are skipped, and it goes on", async () => {
  const agent = fakeAgent([]);
  const h = await harness(agent);
  await h.waitFor((l) => l.type === "ready");
  h.send("not json at all");
  h.send("null");
  h.send({ v: 2, type: "ping", id: "old" });
  h.send({ v: 1, type: "dance" });
  h.send(JSON.stringify({ v: 1, type: "ping", id: "x".repeat(MAX_LINE_BYTES + 10) }));
  h.send({ v: 1, type: "ping", id: "after" });
  const pong = await h.waitFor((l) => l.type === "pong");
  assert.equal(pong.id, "after");
  assert.equal(h.lines.filter((l) => l.type === "pong").length, 1);
  assert.equal(h.logs.length, 5, h.logs.join("\n"));
  h.input.end();
  await h.done;
});

test("an ack moves the cursor, and a restart hands over only what came after it", async () => {
  const dir = await mkdtemp(join(tmpdir(), "xmtp-bridge-"));
  const first = fakeAgent([]);
  const h = await harness(first, { LEMON_XMTP_STATE_DIR: dir });
  await h.waitFor((l) => l.type === "ready");
  first.emit("text", { message: textMessage("m-1", "s1", "one", 5_000_000n), conversation: { id: "conv-1" } });
  await h.waitFor((l) => l.type === "message");
  h.send({ v: 1, type: "ack", id: "m-1" });
  h.send({ v: 1, type: "ping", id: "sync" });
  await h.waitFor((l) => l.type === "pong");
  h.input.end();
  await h.done;
  assert.deepEqual(JSON.parse(await readFile(join(dir, "cursor.json"), "utf8")), { cursor_ns: "5000000" });

  const history = [
    textMessage("m-1", "s1", "one", 5_000_000n),
    textMessage("m-2", "s1", "two", 6_000_000n),
    textMessage("m-3", ME, "my answer", 7_000_000n),
  ];
  const second = fakeAgent([fakeConversation("conv-1", { history })]);
  const again = await harness(second, { LEMON_XMTP_STATE_DIR: dir });
  const caughtUp = await again.waitFor((l) => l.type === "message");
  assert.equal(caughtUp.id, "m-2");
  again.send({ v: 1, type: "ping", id: "sync" });
  await again.waitFor((l) => l.type === "pong");
  assert.deepEqual(again.lines.filter((l) => l.type === "message").map((l) => l.id), ["m-2"]);
  again.input.end();
  await again.done;
});

/** A remote attachment's content as the SDK decodes it. */
function remoteAttachment(overrides = {}) {
  return {
    url: "https://files.example/abc",
    contentDigest: "ab".repeat(32),
    secret: new Uint8Array(32).fill(1),
    salt: new Uint8Array(32).fill(2),
    nonce: new Uint8Array(12).fill(3),
    scheme: "https://",
    contentLength: 1234,
    filename: "notes.txt",
    ...overrides,
  };
}

test("a remote attachment is handed over as its metadata, never fetched", async () => {
  const agent = fakeAgent([]);
  const h = await harness(agent);
  await h.waitFor((l) => l.type === "ready");
  const fetched = [];
  const realFetch = globalThis.fetch;
  globalThis.fetch = async (url) => {
    fetched.push(url);
    throw new Error("the bridge must not fetch");
  };
  try {
    agent.emit("attachment", {
      message: textMessage("m-file", "s1", remoteAttachment(), 9_000_000n),
      conversation: { id: "conv-1" },
    });
    const message = await h.waitFor((l) => l.type === "message");
    assert.deepEqual(message, {
      v: 1, type: "message", id: "m-file", conversation_id: "conv-1", sender: "s1", text: "", sent_at_ms: 9,
      attachment: {
        url: "https://files.example/abc",
        filename: "notes.txt",
        content_length: 1234,
        secret: Buffer.alloc(32, 1).toString("base64"),
        salt: Buffer.alloc(32, 2).toString("base64"),
        nonce: Buffer.alloc(12, 3).toString("base64"),
        content_digest: "ab".repeat(32),
        scheme: "https://",
      },
    });
    assert.deepEqual(fetched, []);
    // Small: the line carries no file, whatever its size.
    assert.ok(JSON.stringify(message).length < 1024);
  } finally {
    globalThis.fetch = realFetch;
  }
  h.input.end();
  await h.done;
});

test("only a complete remote attachment is one", () => {
  assert.equal(remoteAttachmentFields("text"), null);
  assert.equal(remoteAttachmentFields(null), null);
  assert.equal(remoteAttachmentFields(remoteAttachment({ secret: "not bytes" })), null);
  assert.equal(remoteAttachmentFields(remoteAttachment({ url: undefined })), null);
  const bare = remoteAttachmentFields(remoteAttachment({ filename: undefined, contentLength: undefined }));
  assert.equal(bare.filename, null);
  assert.equal(bare.content_length, null);
});
