// An agent with the official MCP TypeScript SDK, unmodified: it connects
// through the gateway with its gateway key, lists tools, calls "search"
// twice under an rpm of 1 and reports how the second call failed, then
// lists tools again on the same session.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const transport = new StreamableHTTPClientTransport(new URL(process.env.SLUICE_MCP_URL), {
  requestInit: { headers: { Authorization: 'Bearer ' + process.env.SLUICE_API_KEY } },
});
const client = new Client({ name: 'node-agent', version: '1.0.0' });
await client.connect(transport);
const out = {};
out.tools = (await client.listTools()).tools.map((t) => t.name).sort();
out.first = (await client.callTool({ name: 'search', arguments: { text: 'x' } })).content[0].text;
try {
  await client.callTool({ name: 'search', arguments: { text: 'y' } });
  out.second = 'admitted';
} catch (e) {
  out.second = { code: e.code, data: e.data };
}
out.after = (await client.listTools()).tools.length;
await client.close();
console.log(JSON.stringify(out));
