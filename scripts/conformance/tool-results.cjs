// Every native tool's results through the official TypeScript SDK's Client, which validates
// structured content against the tool's declared output schema (as the MCP Inspector and most
// desktop clients do): each error path must come back as a tool error the SDK accepts, with
// its message in text and no structured content; each success must pass the SDK's validation.
//
// Run by scripts/conformance.sh against `scopegate serve --demo`, with
//   NODE_PATH                       the install folder's node_modules (the SDK is pinned there)
//   SCOPEGATE_SDK_URL               the gateway's /mcp URL
//   SCOPEGATE_SDK_TOKENS            JSON object: demo subject -> bearer token
// Prints one line per check and exits 1 when any failed.

"use strict";

const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");

const url = new URL(process.env.SCOPEGATE_SDK_URL);
const tokens = JSON.parse(process.env.SCOPEGATE_SDK_TOKENS);

function daysAgo(n) {
  const d = new Date();
  d.setUTCDate(d.getUTCDate() - n);
  return d.toISOString().slice(0, 10);
}
const yesterday = daysAgo(1);

// [caller, tool, arguments, text the error message must contain]
const errors = [
  ["olivia", "whoami", { extra: 1 }, "`extra`"],
  ["olivia", "list_flocks", { extra: 1 }, "`extra`"],
  ["olivia", "get_flock", { flock: "no-such-barn" }, "flock not found"],
  ["wanda", "get_flock", { flock: "south-barn" }, "flock not found"],
  ["olivia", "get_flock", { flock: "hilltop" }, "flock not found"],
  ["olivia", "get_flock", {}, "`flock`"],
  ["olivia", "get_flock", { flock: 7 }, "`flock`"],
  ["olivia", "query_egg_counts", { from: "someday", to: yesterday }, "`from`"],
  ["olivia", "query_egg_counts", { from: daysAgo(3), to: "2026-13-01" }, "`to`"],
  ["olivia", "query_egg_counts", { from: yesterday, to: daysAgo(3) }, "`to`"],
  ["olivia", "query_egg_counts", { from: daysAgo(400), to: yesterday }, "`to`"],
  ["wanda", "query_egg_counts", { from: daysAgo(3), to: yesterday, flock: "south-barn" }, "flock not found"],
  ["olivia", "record_egg_count", { flock: "north-barn", day: "2999-01-01", eggs: 3 }, "`day`"],
  ["olivia", "record_egg_count", { flock: "north-barn", day: daysAgo(400), eggs: 3 }, "`day`"],
  ["olivia", "record_egg_count", { flock: "north-barn", day: yesterday, eggs: -1 }, "`eggs`"],
  ["olivia", "record_egg_count", { flock: "north-barn", day: yesterday, eggs: "many" }, "`eggs`"],
  ["wanda", "record_egg_count", { flock: "south-barn", day: yesterday, eggs: 3 }, "flock not found"],
  ["olivia", "recent_audit_events", { limit: 0 }, "`limit`"],
  ["audrey", "recent_audit_events", { limit: "x" }, "`limit`"],
];

const successes = [
  ["olivia", "whoami", {}],
  ["wanda", "whoami", {}],
  ["olivia", "list_flocks", {}],
  ["olivia", "get_flock", { flock: "north-barn" }],
  ["olivia", "query_egg_counts", { from: daysAgo(5), to: yesterday }],
  ["wanda", "query_egg_counts", { from: daysAgo(5), to: yesterday, flock: "north-barn" }],
  ["olivia", "record_egg_count", { flock: "north-barn", day: yesterday, eggs: 12 }],
  ["audrey", "recent_audit_events", { limit: 5 }],
];

async function connect(who) {
  const subject = `${who}@acme.test`;
  const token = tokens[subject];
  if (!token) throw new Error(`no demo token for ${subject}`);
  const transport = new StreamableHTTPClientTransport(url, {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  const client = new Client({ name: "scopegate-sdk-tool-results", version: "1" });
  await client.connect(transport);
  // The SDK validates structured content only for tools whose output schema it has seen.
  const { tools } = await client.listTools();
  return { client, transport, tools };
}

function text(result) {
  return (result.content || []).filter((c) => c.type === "text").map((c) => c.text).join("");
}

async function main() {
  const callers = {};
  for (const who of ["olivia", "wanda", "audrey"]) callers[who] = await connect(who);
  let passed = 0;
  let failed = 0;
  const check = async (label, body) => {
    try {
      await body();
      passed += 1;
      console.log(`  ok   ${label}`);
    } catch (e) {
      failed += 1;
      console.log(`  FAIL ${label}: ${e && e.message ? e.message : e}`);
    }
  };

  const native = new Set(callers.olivia.tools.map((t) => t.name).filter((n) => !n.includes("__")));
  for (const name of native) {
    const tool = callers.olivia.tools.find((t) => t.name === name);
    await check(`${name} declares an output schema`, async () => {
      if (!tool.outputSchema) throw new Error("no outputSchema: the SDK would validate nothing");
    });
  }
  const covered = new Set(errors.map(([, name]) => name));
  await check("every native tool's error paths are called", async () => {
    const missing = [...native].filter((n) => !covered.has(n));
    if (missing.length) throw new Error(`not covered: ${missing.join(", ")}`);
  });

  for (const [who, name, args, expected] of errors) {
    await check(`${who} ${name} ${JSON.stringify(args)} -> tool error`, async () => {
      // callTool throws "Structured content does not match the tool's output schema" when
      // the SDK rejects the result.
      const result = await callers[who].client.callTool({ name, arguments: args });
      if (result.isError !== true) throw new Error(`not a tool error: ${JSON.stringify(result)}`);
      if (result.structuredContent !== undefined) {
        throw new Error(`carries structured content: ${JSON.stringify(result.structuredContent)}`);
      }
      if (!text(result).includes(expected)) throw new Error(`text "${text(result)}" lacks "${expected}"`);
    });
  }
  for (const [who, name, args] of successes) {
    await check(`${who} ${name} ${JSON.stringify(args)} -> validated output`, async () => {
      const result = await callers[who].client.callTool({ name, arguments: args });
      if (result.isError) throw new Error(`failed: ${text(result)}`);
      if (result.structuredContent === undefined) throw new Error("no structured content");
    });
  }

  for (const [who, { client, transport }] of Object.entries(callers)) {
    await check(`${who} terminates the session`, async () => {
      await transport.terminateSession(); // throws unless the DELETE answered 2xx (or 405)
      await client.close();
    });
  }
  console.log(`sdk tool results: ${passed} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}

main().catch((e) => {
  console.error(`sdk tool results: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
});
