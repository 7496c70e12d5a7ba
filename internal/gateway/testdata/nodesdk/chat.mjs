// chat.mjs: the official OpenAI Node SDK, unmodified, against the gateway
// at SLUICE_BASE_URL with key SLUICE_API_KEY. It asks for one streamed chat
// completion, then one JSON chat completion, and prints what arrived as one
// JSON line. TestPoolOpenAINodeSDK (nodesdk_test.go) runs it from a cache
// directory holding the pinned `openai` package; the SDK's own retries are
// off, so an error the gateway lets through fails the run.
import OpenAI from 'openai';

const client = new OpenAI({
  baseURL: process.env.SLUICE_BASE_URL,
  apiKey: process.env.SLUICE_API_KEY,
  maxRetries: 0,
  timeout: 30_000,
});
const messages = [{ role: 'user', content: 'hello from the official Node SDK' }];

const stream = await client.chat.completions.create({
  model: 'gpt-test',
  messages,
  max_tokens: 20,
  stream: true,
  stream_options: { include_usage: true },
});
let streamed = '';
let streamUsage = null;
let chunks = 0;
for await (const chunk of stream) {
  chunks++;
  for (const choice of chunk.choices ?? []) streamed += choice.delta?.content ?? '';
  if (chunk.usage) streamUsage = chunk.usage;
}

const resp = await client.chat.completions.create({ model: 'gpt-test', messages, max_tokens: 20 });

console.log(JSON.stringify({
  stream: { content: streamed, chunks, completion_tokens: streamUsage?.completion_tokens ?? -1 },
  json: { content: resp.choices[0]?.message?.content ?? '', completion_tokens: resp.usage?.completion_tokens ?? -1 },
}));
