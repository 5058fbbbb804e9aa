// The reference side of traind's tokenizer tests and bench: Hugging Face tokenizers' Node
// bindings (Rust inside) encode and decode exactly what our C++ does, from the same files.
//   node tokenizer_ref.js encode REQUEST.json OUT.json
//     REQUEST: {"tokenizer": "path/tokenizer.json", "texts": [...], "add_special_tokens": bool,
//               "decode": [[ids], ...], "skip_special_tokens": bool}
//     OUT:     {"ids": [[...], ...], "decoded": [...]}
//   node tokenizer_ref.js bench TOKENIZER.json TEXT_FILE ROUNDS
//     encodes TEXT_FILE cut after single newlines into 64 KiB parts with encodeBatch (threads: the
//     RAYON_NUM_THREADS environment variable); prints "MB/s <best rate>" and "tokens <count>".
'use strict';
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

async function encode(requestPath, outPath) {
  const req = JSON.parse(fs.readFileSync(requestPath, 'utf8'));
  const tok = Tokenizer.fromFile(req.tokenizer);
  const add = !!req.add_special_tokens;
  const ids = [];
  for (const t of req.texts || []) {
    const e = await tok.encode(t, null, { addSpecialTokens: add });
    ids.push(Array.from(e.getIds()));
  }
  const decoded = [];
  for (const d of req.decode || []) decoded.push(await tok.decode(d, !!req.skip_special_tokens));
  fs.writeFileSync(outPath, JSON.stringify({ ids, decoded }));
}

function cutAtLines(text, target) {
  const parts = [];
  let start = 0;
  while (start < text.length) {
    let end = Math.min(text.length, start + target);
    while (end < text.length && !(text[end - 1] === '\n' && /\S/.test(text[end]) && /\S/.test(text[end - 2]))) end++;
    parts.push(text.slice(start, end));
    start = end;
  }
  return parts;
}

async function bench(tokPath, textPath, rounds) {
  const tok = Tokenizer.fromFile(tokPath);
  const text = fs.readFileSync(textPath, 'utf8');
  const bytes = Buffer.byteLength(text, 'utf8');
  const parts = cutAtLines(text, 64 * 1024);
  let best = 0;
  let count = 0;
  for (let r = 0; r < rounds; r++) {
    const t0 = process.hrtime.bigint();
    const encs = await tok.encodeBatch(parts, { addSpecialTokens: false });
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    count = encs.reduce((n, e) => n + e.getLength(), 0);
    best = Math.max(best, bytes / 1e6 / dt);
  }
  console.log('MB/s ' + best.toFixed(3));
  console.log('tokens ' + count);
}

const [mode, a, b, c] = process.argv.slice(2);
const run = mode === 'encode' ? encode(a, b) : mode === 'bench' ? bench(a, b, Number(c || 3)) : null;
if (!run) {
  console.error('usage: tokenizer_ref.js encode REQUEST.json OUT.json | bench TOKENIZER.json FILE [ROUNDS]');
  process.exit(2);
}
run.catch((e) => {
  console.error('tokenizer_ref.js: ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
