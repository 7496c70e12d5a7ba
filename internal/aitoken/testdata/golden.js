// Writes golden.json: the token count of every text of corpus.json under
// cl100k_base and o200k_base, counted by OpenAI's tiktoken (the npm
// package tiktoken@1.0.22, tiktoken's Rust core compiled to WebAssembly),
// plus random texts from a fixed seed. Run: npm install tiktoken@1.0.22 &&
// node golden.js (from this directory).
const fs = require("fs");
const { get_encoding } = require("tiktoken");
const corpus = JSON.parse(fs.readFileSync(__dirname + "/corpus.json", "utf8"));
let seed = 16;
const rand = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const alphabet = ["a", "b", "Z", "Q", "é", "\u0301", " ", "  ", "\n", "\r\n", "\t", "'", "'s", "'LL", "1", "22", "١", "!", "?", "/", ".", "-", "日", "本", "ʰ", "ǅ", "😀", "👍🏽", "\u00a0", "x", "Hello", " world", "HTTP", "Server", "\u3000", "ß", "İ", "ﬁ"];
for (let i = 0; i < 300; i++) {
  let s = "";
  const n = 1 + rand(24);
  for (let j = 0; j < n; j++) s += alphabet[rand(alphabet.length)];
  corpus.push({ kind: "random", text: s });
}
const encs = ["cl100k_base", "o200k_base"].map((e) => [e, get_encoding(e)]);
const out = corpus.map((c) => {
  const r = { kind: c.kind, text: c.text };
  for (const [name, enc] of encs) r[name] = enc.encode_ordinary(c.text).length;
  return r;
});
fs.writeFileSync(__dirname + "/golden.json", JSON.stringify(out, null, 1) + "\n");
