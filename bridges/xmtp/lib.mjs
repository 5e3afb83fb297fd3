// The XMTP bridge of Lemon Gateway: holds the wallet and the XMTP connection
// (the XMTP Agent SDK) and speaks newline-delimited JSON with the gateway over
// stdin/stdout. Protocol version 1 (every line has "v": 1):
//
//   bridge → gateway  ready   {inbox_id, address, env}
//                     message {id, conversation_id, sender, sender_address?, text, sent_at_ms,
//                              attachment?}
//                     sent    {request_id, message_id}
//                     error   {request_id?, message, retry}
//                     pong    {id}
//   gateway → bridge  ack     {id}
//                     send    {request_id, conversation_id, text}
//                     ping    {id}
//
// A remote attachment is a message with `text` "" and `attachment` {url,
// filename, content_length, secret, salt, nonce (base64), content_digest,
// scheme}: its metadata only. The bridge never fetches it (the SDK's
// downloadRemoteAttachment would fetch any URL, of any size); the gateway
// fetches, checks and decrypts it.
//
// The SDK is injected (`createAgent`), so the handling here is tested with the
// SDK's objects mocked (lib.test.mjs); bridge.mjs, the entry point the
// gateway starts, imports the real SDK.
// The wallet key comes in the environment (XMTP_WALLET_KEY), never argv, and
// is never written anywhere.

import { createInterface } from "node:readline";
import { readFile, writeFile, rename, mkdir } from "node:fs/promises";
import { join } from "node:path";

export const PROTOCOL_VERSION = 1;
/** The longest line read from the gateway. */
export const MAX_LINE_BYTES = 1024 * 1024;
/** How many sent request ids are remembered, so a repeated send is not sent twice. */
const SENT_MEMORY = 1000;

/**
 * Runs the bridge until `input` ends.
 *
 * @param {object} deps
 * @param {(env: object) => Promise<object>} deps.createAgent an Agent-like object:
 *   `on(event, handler)`, `start()`, `stop()`, `address`, `client.inboxId`,
 *   `client.conversations.getConversationById(id)`, `client.conversations.syncAll()`,
 *   `client.conversations.list()`
 * @param {import("node:stream").Readable} deps.input lines from the gateway
 * @param {{ write(text: string): unknown }} deps.output lines to the gateway
 * @param {object} deps.env the environment (XMTP_ENV, LEMON_XMTP_STATE_DIR…)
 * @param {(message: string) => void} [deps.log] diagnostics (stderr)
 */
export async function runBridge({ createAgent, input, output, env, log = () => {} }) {
  const emit = (type, fields) => {
    output.write(JSON.stringify({ v: PROTOCOL_VERSION, type, ...fields }) + "\n");
  };
  const state = new Cursor(env.LEMON_XMTP_STATE_DIR);
  await state.load();
  const agent = await createAgent(env);
  const inboxId = () => agent.client?.inboxId;
  /** Message ids handed over and not acked yet → their sent-at (ns). */
  const unacked = new Map();
  /** request id → message id of sends already made. */
  const sentRequests = new Map();

  const handOver = (message, conversationId) => {
    if (message.senderInboxId && message.senderInboxId === inboxId()) return;
    const attachment = remoteAttachmentFields(message.content);
    if (typeof message.content !== "string" && attachment === null) return;
    const sentAtNs = toBigInt(message.sentAtNs);
    unacked.set(message.id, sentAtNs);
    emit("message", {
      id: message.id,
      conversation_id: conversationId ?? message.conversationId,
      sender: message.senderInboxId,
      text: attachment === null ? message.content : "",
      sent_at_ms: Number(sentAtNs / 1_000_000n),
      ...(attachment === null ? {} : { attachment }),
    });
  };

  agent.on("text", (ctx) => handOver(ctx.message, ctx.conversation?.id));
  agent.on("attachment", (ctx) => handOver(ctx.message, ctx.conversation?.id));
  agent.on("unhandledError", (error) => log(`xmtp error: ${error?.message ?? error}`));

  const handleLine = async (line) => {
    if (Buffer.byteLength(line) > MAX_LINE_BYTES) {
      log("a line over the limit; skipped");
      return;
    }
    let request;
    try {
      request = JSON.parse(line);
    } catch {
      log("a line that is not JSON; skipped");
      return;
    }
    if (request === null || typeof request !== "object" || request.v !== PROTOCOL_VERSION) {
      log("a line of another protocol version; skipped");
      return;
    }
    switch (request.type) {
      case "ping":
        emit("pong", { id: String(request.id ?? "") });
        return;
      case "ack": {
        const sentAtNs = unacked.get(request.id);
        unacked.delete(request.id);
        if (sentAtNs !== undefined) await state.advance(sentAtNs);
        return;
      }
      case "send":
        await send(request);
        return;
      default:
        log(`unknown type ${JSON.stringify(request.type)}; skipped`);
    }
  };

  const send = async ({ request_id: requestId, conversation_id: conversationId, text }) => {
    if (typeof requestId !== "string" || typeof conversationId !== "string" || typeof text !== "string") {
      emit("error", { request_id: requestId, message: "send needs request_id, conversation_id and text", retry: false });
      return;
    }
    const already = sentRequests.get(requestId);
    if (already !== undefined) {
      emit("sent", { request_id: requestId, message_id: already });
      return;
    }
    try {
      const conversation = await agent.client.conversations.getConversationById(conversationId);
      if (!conversation) {
        emit("error", { request_id: requestId, message: `no conversation ${conversationId}`, retry: false });
        return;
      }
      const messageId = await conversation.sendText(text);
      sentRequests.set(requestId, String(messageId ?? ""));
      if (sentRequests.size > SENT_MEMORY) sentRequests.delete(sentRequests.keys().next().value);
      emit("sent", { request_id: requestId, message_id: String(messageId ?? "") });
    } catch (error) {
      emit("error", { request_id: requestId, message: String(error?.message ?? error), retry: true });
    }
  };

  await agent.start();
  emit("ready", { inbox_id: inboxId(), address: agent.address ?? null, env: env.XMTP_ENV ?? "dev" });
  await catchUp(agent, state.cursorNs, handOver, log);

  // Lines are handled one at a time, in order.
  const lines = createInterface({ input, crlfDelay: Infinity });
  for await (const line of lines) {
    if (line.trim() === "") continue;
    try {
      await handleLine(line);
    } catch (error) {
      log(`a line failed: ${error?.message ?? error}`);
    }
  }
  await agent.stop();
}

/** Hands over the messages that came while the bridge was down (after the cursor). */
async function catchUp(agent, cursorNs, handOver, log) {
  if (cursorNs === 0n) return;
  try {
    await agent.client.conversations.syncAll();
    const conversations = await agent.client.conversations.list();
    for (const conversation of conversations) {
      const messages = await conversation.messages({ sentAfterNs: cursorNs });
      for (const message of messages) handOver(message, conversation.id);
    }
  } catch (error) {
    log(`catching up failed: ${error?.message ?? error}`);
  }
}

/**
 * The protocol's `attachment` fields of a remote attachment's content (the
 * SDK's RemoteAttachment: url, contentDigest, secret, salt, nonce, scheme,
 * contentLength?, filename?), or null when `content` is not one.
 */
export function remoteAttachmentFields(content) {
  if (content === null || typeof content !== "object") return null;
  const { url, contentDigest, secret, salt, nonce, scheme, contentLength, filename } = content;
  if (typeof url !== "string" || typeof contentDigest !== "string") return null;
  if (![secret, salt, nonce].every((bytes) => bytes instanceof Uint8Array)) return null;
  const length = Number(contentLength);
  return {
    url,
    filename: typeof filename === "string" && filename !== "" ? filename : null,
    content_length: Number.isSafeInteger(length) && length >= 0 ? length : null,
    secret: Buffer.from(secret).toString("base64"),
    salt: Buffer.from(salt).toString("base64"),
    nonce: Buffer.from(nonce).toString("base64"),
    content_digest: contentDigest,
    scheme: typeof scheme === "string" ? scheme : "",
  };
}

function toBigInt(value) {
  if (typeof value === "bigint") return value;
  if (typeof value === "number" && Number.isFinite(value)) return BigInt(Math.trunc(value));
  return 0n;
}

/** The sent-at of the newest acked message, kept in `<dir>/cursor.json`. */
class Cursor {
  constructor(dir) {
    this.path = dir ? join(dir, "cursor.json") : null;
    this.cursorNs = 0n;
  }

  async load() {
    if (!this.path) return;
    try {
      const saved = JSON.parse(await readFile(this.path, "utf8"));
      this.cursorNs = BigInt(saved.cursor_ns ?? 0);
    } catch {
      this.cursorNs = 0n;
    }
  }

  async advance(sentAtNs) {
    if (sentAtNs <= this.cursorNs) return;
    this.cursorNs = sentAtNs;
    if (!this.path) return;
    await mkdir(join(this.path, ".."), { recursive: true });
    const temporary = `${this.path}.tmp`;
    await writeFile(temporary, JSON.stringify({ cursor_ns: this.cursorNs.toString() }));
    await rename(temporary, this.path);
  }
}
