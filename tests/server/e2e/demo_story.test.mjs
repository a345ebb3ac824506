// The built-in demo model writes English: asked for short stories (8 seeds, its own
// sampling defaults), most whitespace-separated words of its replies are dictionary-shaped
// (letters, with an apostrophe or hyphen inside and punctuation around), and the replies
// hold sentences.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer } from "./harness.mjs";

const WORD = /^[("'[]*[A-Za-z]+(?:['-][A-Za-z]+)*[)"'\].,;:!?]*$/;
const SENTENCE = /[A-Z][a-z']*(?:\s+\S+){2,}?[.!?](?:\s|$)/g;

let server;
before(async () => (server = await startServer()));
after(async () => assert.equal((await server.stop()).code, 0, server.stderr()));

test("asked for a short story, the demo model answers in English sentences", async (t) => {
  let words = 0, shaped = 0, sentences = 0;
  for (let seed = 1; seed <= 8; ++seed) {
    const res = await fetch(server.url + "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "kiln-demo", seed, max_tokens: 120,
                             messages: [{ role: "user", content: "Tell me a short story." }] }),
    });
    assert.equal(res.status, 200);
    const text = (await res.json()).choices[0].message.content;
    const w = text.split(/\s+/).filter(Boolean);
    words += w.length;
    shaped += w.filter((x) => WORD.test(x)).length;
    sentences += (text.match(SENTENCE) || []).length;
    t.diagnostic(`seed ${seed}: ${JSON.stringify(text.slice(0, 120))}`);
  }
  t.diagnostic(`${shaped} of ${words} words dictionary-shaped, ${sentences} sentences`);
  assert.ok(words >= 60, `only ${words} words in 8 replies`);
  assert.ok(shaped / words >= 0.8, `${shaped} of ${words} words are dictionary-shaped`);
  assert.ok(sentences >= 3, `${sentences} sentences`);
});
