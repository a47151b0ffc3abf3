// The official MCP TypeScript SDK client as a baseline for `mcp_call.rs`: one `Client`
// over `StdioClientTransport`, connected once, like Quiver's pooled connection.
//
//   node ts_client.mjs NODE_MODULES TOOL ARGS_JSON COMMAND [ARG...]
//
// It connects to the server COMMAND starts, prints `ready`, then for every line `N` it reads
// on stdin calls TOOL with ARGS_JSON N times, one after another, and prints the mean time
// per call in microseconds. It exits when stdin closes.
import { createInterface } from "node:readline";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, tool, argsJson, command, ...commandArgs] = process.argv.slice(2);
const sdk = (file) =>
  import(pathToFileURL(join(nodeModules, "@modelcontextprotocol/sdk/dist/esm", file)).href);
const { Client } = await sdk("client/index.js");
const { StdioClientTransport } = await sdk("client/stdio.js");

const client = new Client({ name: "quiver-bench-ts-client", version: "1.0.0" });
await client.connect(
  new StdioClientTransport({ command, args: commandArgs, stderr: "ignore" }),
);
const args = JSON.parse(argsJson);
console.log("ready");

for await (const line of createInterface({ input: process.stdin })) {
  const calls = Number.parseInt(line, 10);
  const started = process.hrtime.bigint();
  for (let i = 0; i < calls; i++) {
    const result = await client.callTool({ name: tool, arguments: args });
    if (result.isError) {
      throw new Error(`the tool failed: ${JSON.stringify(result)}`);
    }
  }
  const elapsed = Number(process.hrtime.bigint() - started) / 1000;
  console.log((elapsed / calls).toFixed(3));
}
await client.close();
