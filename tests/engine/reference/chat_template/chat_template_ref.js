// The reference side of traind's chat template tests: Hugging Face's Jinja renderer for chat
// templates (@huggingface/jinja, what transformers.js uses) renders the same (template, variables)
// cases as engine/src/data/chat_template.cc.
//   node chat_template_ref.js REQUEST.json OUT.json
//     REQUEST: {"cases": [{"template": "<jinja source>", "vars": {...}}, ...]}
//     OUT:     {"results": [{"ok": true, "text": "..."} or {"ok": false, "error": "..."}, ...]}
'use strict';
const fs = require('fs');
const { Template } = require('@huggingface/jinja');

const [reqPath, outPath] = process.argv.slice(2);
if (!reqPath || !outPath) {
  console.error('usage: node chat_template_ref.js REQUEST.json OUT.json');
  process.exit(2);
}
const req = JSON.parse(fs.readFileSync(reqPath, 'utf8'));
const results = [];
for (const c of req.cases) {
  try {
    results.push({ ok: true, text: new Template(c.template).render(c.vars) });
  } catch (e) {
    results.push({ ok: false, error: String(e && e.message !== undefined ? e.message : e) });
  }
}
fs.writeFileSync(outPath, JSON.stringify({ results }));
