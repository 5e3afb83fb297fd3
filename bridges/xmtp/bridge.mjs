// The XMTP bridge's entry point, started by Lemon Gateway as `node bridge.mjs`:
// the real XMTP Agent SDK behind runBridge (lib.mjs). Install the SDK with
// `npm ci --prefix bridges/xmtp`.
//
// Environment (set by the gateway): XMTP_WALLET_KEY (the wallet's private key),
// XMTP_DB_ENCRYPTION_KEY (optional, 32 bytes hex), XMTP_ENV (dev | production |
// local), LEMON_XMTP_STATE_DIR (the SDK's database and the bridge's cursor).

import { join } from "node:path";
import { Agent, createSigner, createUser } from "@xmtp/agent-sdk";
import { runBridge } from "./lib.mjs";

async function createAgent(env) {
  const user = createUser(env.XMTP_WALLET_KEY);
  const stateDir = env.LEMON_XMTP_STATE_DIR;
  const xmtpEnv = env.XMTP_ENV ?? "dev";
  return Agent.create(createSigner(user), {
    env: xmtpEnv,
    dbEncryptionKey: env.XMTP_DB_ENCRYPTION_KEY || undefined,
    dbPath: stateDir ? (inboxId) => join(stateDir, `xmtp-${xmtpEnv}-${inboxId}.db3`) : undefined,
  });
}

const log = (message) => process.stderr.write(`${message}\n`);

runBridge({ createAgent, input: process.stdin, output: process.stdout, env: process.env, log }).then(
  () => process.exit(0),
  (error) => {
    log(`the bridge stopped: ${error?.message ?? error}`);
    process.exit(1);
  },
);
