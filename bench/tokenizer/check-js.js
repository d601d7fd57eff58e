// bench/tokenizer/check-js.js — a second oracle for large texts without Python: compares the
// ids tok-bench dumped (--dump-dir) with those of transformers.js's tokenizer port,
// @lenml/tokenizers (no dependencies).  Fetch it once, e.g.
//   (mkdir -p corpus/npm && cd corpus/npm && npm pack @lenml/tokenizers@3.7.2 && tar xzf lenml-tokenizers-3.7.2.tgz)
// then, for a model directory and a corpus file:
//   build-bench/tok-bench -r 1 --dump-dir /tmp/ids DIR corpus/tokenizer/code.txt
//   node bench/tokenizer/check-js.js corpus/npm/package DIR corpus/tokenizer/code.txt /tmp/ids/code.txt.ids
// Exit status 0 when the ids are identical.
const fs = require('fs');
const path = require('path');
const [pkg, dir, file, idsFile] = process.argv.slice(2);
if (!idsFile) {
  console.error('usage: node check-js.js LENML_TOKENIZERS_PACKAGE_DIR MODEL_DIR TEXT_FILE IDS_FILE');
  process.exit(2);
}
const { TokenizerLoader } = require(path.resolve(pkg, 'dist/main.js'));
const readJson = (f) => (fs.existsSync(f) ? JSON.parse(fs.readFileSync(f, 'utf8')) : {});
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: readJson(path.join(dir, 'tokenizer.json')),
  tokenizerConfig: readJson(path.join(dir, 'tokenizer_config.json')),
});
const ids = tok.encode(fs.readFileSync(file, 'utf8'), { add_special_tokens: false });
const buf = fs.readFileSync(idsFile);
const ours = new Int32Array(buf.buffer, buf.byteOffset, buf.length / 4);
let diff = -1;
for (let i = 0; i < Math.min(ours.length, ids.length); i++) if (ours[i] !== ids[i]) { diff = i; break; }
if (diff < 0 && ours.length !== ids.length) diff = Math.min(ours.length, ids.length);
const name = path.basename(file);
if (diff < 0) {
  console.log(`${name}: ${ids.length} ids, identical to transformers.js`);
  process.exit(0);
}
console.log(`${name}: differs at id ${diff} (atlas ${ours.length} ids, transformers.js ${ids.length})`);
console.log('  transformers.js', Array.from(ids.slice(Math.max(0, diff - 3), diff + 6)));
console.log('  atlas          ', Array.from(ours.slice(Math.max(0, diff - 3), diff + 6)));
process.exit(1);
