// The official OpenAI Node SDK, unmodified, on the Batch API through the
// gateway: upload a batch file, create, retrieve, list and cancel a batch;
// a second key can neither retrieve the batch nor read the file.
import OpenAI, { toFile } from 'openai';

const base = process.env.SLUICE_BASE_URL;
const one = new OpenAI({ baseURL: base, apiKey: process.env.SLUICE_API_KEY, maxRetries: 0 });
const two = new OpenAI({ baseURL: base, apiKey: process.env.SLUICE_API_KEY_2, maxRetries: 0 });
const line = (i) => JSON.stringify({ custom_id: 'r' + i, method: 'POST', url: '/v1/chat/completions',
  body: { model: 'gpt-test', messages: [{ role: 'user', content: 'hello ' + i }], max_tokens: 50 } });
const file = await one.files.create({ file: await toFile(Buffer.from([0, 1, 2].map(line).join('\n') + '\n'), 'in.jsonl'), purpose: 'batch' });
const batch = await one.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
const got = await one.batches.retrieve(batch.id);
const listed = [];
for await (const b of one.batches.list()) listed.push(b.id);
const status = async (p) => { try { await p; return 200; } catch (e) { return e.status; } };
const out = {
  file: file.id, batch: batch.id, got: got.id, status: got.status, listed,
  otherRetrieve: await status(two.batches.retrieve(batch.id)),
  otherContent: await status(two.files.content(file.id)),
  otherList: (await two.batches.list()).data.length,
  cancelled: (await one.batches.cancel(batch.id)).status,
};
console.log(JSON.stringify(out));
