// Speculative decoding through the APIs: a tool-calling conversation with n-gram drafts
// (fixed depth 3, so drafts are always tried) gives exactly the tool calls, arguments,
// text and finish reasons of the same conversation without them, at temperature 1 with
// seeds, with tool_choice auto, required and named (OpenAI) and any (Anthropic): the
// constrained tool-call blocks are drafted too (verify rows masked by the grammar). The
// official `openai` and `@anthropic-ai/sdk` clients on the demo model.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, requirePeer, metric } from "./harness.mjs";
import { tools, anthropicTools } from "./tools.mjs";

const { OpenAI } = requirePeer("openai");
const Anthropic = requirePeer("@anthropic-ai/sdk").default ?? requirePeer("@anthropic-ai/sdk");

let plain;
let spec;
const clients = {};

before(async () => {
  [plain, spec] = await Promise.all([
    startServer(),
    startServer(["--speculative-method", "ngram", "--num-speculative-tokens", "3", "--speculative-adaptive", "off"]),
  ]);
  for (const [name, s] of [["plain", plain], ["spec", spec]]) {
    clients[name] = {
      openai: new OpenAI({ apiKey: "unused", baseURL: s.url + "/v1", maxRetries: 0, timeout: 120000 }),
      anthropic: new Anthropic({ apiKey: "unused", baseURL: s.url, maxRetries: 0, timeout: 120000 }),
    };
  }
});
after(async () => {
  for (const s of [plain, spec]) {
    const r = await s.stop();
    assert.equal(r.code, 0, "the server drains and exits 0 on SIGTERM:\n" + s.stderr());
  }
});

const noThinking = { chat_template_kwargs: { enable_thinking: false } };

// What must not change: the calls (names, arguments), the text and why it ended; call ids are
// random per server.
function essence(choice) {
  return {
    content: choice.message.content,
    calls: (choice.message.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]),
    finish: choice.finish_reason,
  };
}

test("chat: a tool-calling conversation is the same with speculative decoding", async () => {
  let calls = 0;
  for (const seed of [1, 2, 3]) {
    for (const tool_choice of ["required", { type: "function", function: { name: "add" } }, "auto"]) {
      const messages = [{ role: "user", content: "What is the weather in Paris, and what is 2 + 3?" }];
      // Two turns: the model's calls, the tools' answers, then its reply.
      for (let turn = 0; turn < 2; ++turn) {
        const body = { messages, tools, tool_choice, max_tokens: 160, temperature: 1, seed: seed + 10 * turn,
                       ...noThinking };
        const [a, b] = await Promise.all([clients.plain.openai.chat.completions.create(body),
                                          clients.spec.openai.chat.completions.create(body)]);
        const what = `seed ${seed} tool_choice ${JSON.stringify(tool_choice)} turn ${turn}`;
        assert.deepEqual(essence(b.choices[0]), essence(a.choices[0]), what);
        const m = a.choices[0].message;
        if (!m.tool_calls?.length) break;
        calls += m.tool_calls.length;
        messages.push({ role: "assistant", content: m.content ?? "", tool_calls: m.tool_calls });
        for (const c of m.tool_calls)
          messages.push({ role: "tool", tool_call_id: c.id, content: c.function.name === "add" ? "5" : "sunny, 21 C" });
      }
    }
  }
  assert.ok(calls >= 6, `only ${calls} tool calls were made`);
  const drafted = await metric(spec.url, "kiln_spec_decode_num_draft_tokens_total");
  const accepted = await metric(spec.url, "kiln_spec_decode_num_accepted_tokens_total");
  assert.ok(drafted > 0 && accepted > 0, `drafts ${drafted}, accepted ${accepted}`);
});

test("messages: tool_choice any gives the same tool use with speculative decoding", async () => {
  const atools = anthropicTools;
  let uses = 0;
  for (const seed of [1, 2, 3]) {
    const body = { model: "kiln-demo", max_tokens: 200, temperature: 1, tools: atools, tool_choice: { type: "any" },
                   messages: [{ role: "user", content: "Weather in Oslo?" }], seed, thinking: { type: "disabled" } };
    const [a, b] = await Promise.all([clients.plain.anthropic.messages.create(body),
                                      clients.spec.anthropic.messages.create(body)]);
    const strip = (r) => ({ stop: r.stop_reason,
                            content: r.content.map((x) => (x.type === "tool_use" ? [x.name, x.input] : [x.type, x.text])) });
    assert.deepEqual(strip(b), strip(a), `seed ${seed}`);
    uses += a.content.filter((x) => x.type === "tool_use").length;
  }
  assert.ok(uses >= 2, `only ${uses} tool uses in three replies`);
});
