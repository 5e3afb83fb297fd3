// Checks that the names bridge.mjs imports from the XMTP Agent SDK exist in the
// pinned version installed under the node_modules folder given:
//   node bridges/xmtp/check-sdk.mjs <node_modules>
// The SDK's module is imported when this Node.js can load its native binding;
// otherwise its published type declarations are read.

import { readFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const SDK = "@xmtp/agent-sdk";

async function main(modules) {
  const pinned = JSON.parse(await readFile(join(here, "package.json"), "utf8")).dependencies[SDK];
  const sdkDir = join(modules, ...SDK.split("/"));
  const installed = JSON.parse(await readFile(join(sdkDir, "package.json"), "utf8")).version;
  if (installed !== pinned) throw new Error(`${SDK} ${installed} is installed, ${pinned} is pinned`);

  const entry = await readFile(join(here, "bridge.mjs"), "utf8");
  const imported = [...entry.matchAll(/import\s*\{([^}]*)\}\s*from\s*["']@xmtp\/agent-sdk["']/g)]
    .flatMap((m) => m[1].split(","))
    .map((name) => name.trim().split(/\s+as\s+/)[0])
    .filter(Boolean);
  if (imported.length === 0) throw new Error(`bridge.mjs imports nothing from ${SDK}`);

  let exported;
  let how;
  try {
    const module = await import(pathToFileURL(join(sdkDir, "dist", "index.js")).href);
    exported = new Set(Object.keys(module));
    if (typeof module.Agent?.create !== "function") throw new Error("Agent.create is not a function");
    how = "imported";
  } catch (error) {
    if (!/native binding|NODE_MODULE_VERSION|ERR_DLOPEN/i.test(String(error?.message))) throw error;
    const types = await readFile(join(sdkDir, "dist", "index.d.ts"), "utf8");
    exported = new Set(
      [...types.matchAll(/export\s*\{([^}]*)\}/g)].flatMap((m) => m[1].split(",")).map((n) => n.trim()),
    );
    for (const member of ["static create<", "start(", "stop(", "get address()", "get client()"]) {
      if (!types.includes(member)) throw new Error(`the SDK's Agent has no ${member}`);
    }
    how = `read from its type declarations (this Node.js cannot load it: ${String(error.message).split("\n")[0]})`;
  }
  const missing = imported.filter((name) => !exported.has(name));
  if (missing.length > 0) throw new Error(`${SDK} ${installed} does not export ${missing.join(", ")}`);
  process.stdout.write(`${SDK} ${installed} exports ${imported.join(", ")} (${how})\n`);
}

main(process.argv[2] ?? join(here, "node_modules")).catch((error) => {
  process.stderr.write(`xmtp sdk check failed: ${error?.message ?? error}\n`);
  process.exit(1);
});
