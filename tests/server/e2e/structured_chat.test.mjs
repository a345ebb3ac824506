// Structured output on the chat APIs, with the official `openai` and `@anthropic-ai/sdk`
// clients on the demo model at temperature 1 over several seeds, every reply validated by
// ajv against the schema it was constrained to: response_format json_schema / json_object
// and structured_outputs (streaming and not, n = 2, with the reasoning the demo template
// allows before the answer), tool_choice required / named (OpenAI) and any / tool
// (Anthropic), whose calls the Hermes parser must find with arguments valid for the
// function; bad schemas and impossible tool choices are 400s.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, requirePeer } from "./harness.mjs";
import { tools, anthropicTools } from "./tools.mjs";

const { OpenAI, BadRequestError } = requirePeer("openai");
const Anthropic = requirePeer("@anthropic-ai/sdk").default ?? requirePeer("@anthropic-ai/sdk");
const Ajv = requirePeer("ajv").default ?? requirePeer("ajv");

let server;
let openai;
let anthropic;
const ajv = new Ajv({ strict: false });

before(async () => {
  server = await startServer();
  openai = new OpenAI({ apiKey: "unused", baseURL: server.url + "/v1", maxRetries: 0, timeout: 120000 });
  anthropic = new Anthropic({ apiKey: "unused", baseURL: server.url, maxRetries: 0, timeout: 120000 });
});
after(async () => {
  const r = await server.stop();
  assert.equal(r.code, 0, "the server drains and exits 0 on SIGTERM:\n" + server.stderr());
});

const record = {
  type: "object",
  properties: {
    name: { type: "string", minLength: 1, maxLength: 12 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    mood: { enum: ["happy", "sad", "calm"] },
    tags: { type: "array", items: { type: "string", maxLength: 8 }, maxItems: 3 },
    id: { type: "string", format: "uuid" },
  },
  required: ["name", "age", "mood", "tags"],
  additionalProperties: false,
};
const validRecord = ajv.compile(record);

function assertValid(validate, text, what) {
  let doc;
  assert.doesNotThrow(() => { doc = JSON.parse(text); }, `${what}: not JSON: ${JSON.stringify(text)}`);
  assert.ok(validate(doc), `${what}: ${text}: ${ajv.errorsText(validate.errors)}`);
  return doc;
}

const noThinking = { chat_template_kwargs: { enable_thinking: false } };
const ask = [{ role: "user", content: "Describe a person as a record." }];

test("chat: response_format json_schema replies validate, streamed or not, n = 2", async () => {
  for (const seed of [1, 2, 3, 4]) {
    const body = {
      messages: ask, max_tokens: 200, temperature: 1, seed, n: 2, ...noThinking,
      response_format: { type: "json_schema", json_schema: { name: "record", strict: true, schema: record } },
    };
    const r = await openai.chat.completions.create(body);
    assert.equal(r.choices.length, 2);
    for (const c of r.choices) {
      assertValid(validRecord, c.message.content, `seed ${seed} choice ${c.index}`);
      assert.equal(c.finish_reason, "stop");
    }
    const stream = await openai.chat.completions.create({ ...body, stream: true });
    const text = ["", ""];
    const finish = [null, null];
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        text[c.index] += c.delta.content ?? "";
        finish[c.index] = c.finish_reason ?? finish[c.index];
      }
    }
    for (let i = 0; i < 2; ++i) {
      assert.equal(text[i], r.choices[i].message.content, `seed ${seed}: streamed = not streamed`);
      assert.equal(finish[i], "stop");
    }
  }
});

test("chat: json_object and structured_outputs (json, regex, choice)", async () => {
  const anyObject = ajv.compile({ type: "object" });
  for (const seed of [5, 6]) {
    const r = await openai.chat.completions.create({
      messages: ask, max_tokens: 300, temperature: 1, seed, ...noThinking, response_format: { type: "json_object" },
    });
    const c = r.choices[0];
    if (c.finish_reason === "stop") assertValid(anyObject, c.message.content, `json_object seed ${seed}`);
    else assert.ok(c.message.content.startsWith("{"), c.message.content);  // an open-ended object may run long
  }
  const json = await openai.chat.completions.create({
    messages: ask, max_tokens: 200, temperature: 1, seed: 7, ...noThinking, structured_outputs: { json: record },
  });
  assertValid(validRecord, json.choices[0].message.content, "structured_outputs.json");
  const regex = await openai.chat.completions.create({
    messages: ask, max_tokens: 40, temperature: 1, seed: 8, ...noThinking,
    structured_outputs: { regex: "[A-Z][a-z]{2,8} (is|was) [0-9]{1,2}" },
  });
  assert.match(regex.choices[0].message.content, /^[A-Z][a-z]{2,8} (is|was) [0-9]{1,2}$/);
  assert.equal(regex.choices[0].finish_reason, "stop");
  // A GBNF grammar (llama.cpp's notation), on chat and on completions (llama.cpp's field).
  const gbnf = 'root ::= "Answer: " ( "yes" | "no" ) ", because " [a-z ]{3,30} "."';
  const gbnfReply = /^Answer: (yes|no), because [a-z ]{3,30}\.$/;
  for (const seed of [12, 13]) {
    const g = await openai.chat.completions.create({
      messages: ask, max_tokens: 60, temperature: 1, seed, ...noThinking, structured_outputs: { grammar: gbnf },
    });
    assert.match(g.choices[0].message.content, gbnfReply);
    assert.equal(g.choices[0].finish_reason, "stop");
    const c = await openai.completions.create({ prompt: "Is it?", max_tokens: 60, temperature: 1, seed, grammar: gbnf });
    assert.match(c.choices[0].text, gbnfReply);
  }
  for (const seed of [9, 10, 11]) {
    const choice = await openai.chat.completions.create({
      messages: ask, max_tokens: 10, temperature: 1, seed, ...noThinking,
      structured_outputs: { choice: ["yes", "no", "maybe later"] },
    });
    assert.ok(["yes", "no", "maybe later"].includes(choice.choices[0].message.content), choice.choices[0].message.content);
  }
});

// With reasoning on, the demo template lets the reply open a <think> block before the answer
// (the prompt does not open one). Forced to choose between "{" and "<think>" the demo model
// takes <think> and, never trained to close it, reasons until max_tokens: the reasoning is
// free text (the constraint does not reach inside it) and no broken answer comes out. That
// the answer after a closed block is held to the schema is shown on the grammar itself
// (tests/server/structured_output_test.cpp, ReasoningFrame).
test("chat: with reasoning on, the constraint starts after the reasoning, never inside it", async () => {
  for (const seed of [1, 2, 3]) {
    const r = await openai.chat.completions.create({
      messages: ask, max_tokens: 80, temperature: 1, seed,
      response_format: { type: "json_schema", json_schema: { name: "record", schema: record } },
    });
    const c = r.choices[0];
    if (c.finish_reason === "stop") {
      assertValid(validRecord, c.message.content, `seed ${seed}`);
      continue;
    }
    assert.equal(c.finish_reason, "length");
    assert.ok(!c.message.content, `seed ${seed}: a cut answer: ${c.message.content}`);
    assert.ok(c.message.reasoning_content.length > 0, `seed ${seed}: no reasoning`);
    assert.throws(() => JSON.parse(c.message.reasoning_content), `seed ${seed}: the reasoning was held to JSON`);
  }
});

const argsValid = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));

function assertCalls(calls, what, onlyName) {
  assert.ok(calls && calls.length >= 1, `${what}: no tool call`);
  for (const call of calls) {
    assert.ok(call.function.name in argsValid, `${what}: unknown function ${call.function.name}`);
    if (onlyName) assert.equal(call.function.name, onlyName, what);
    assertValid(argsValid[call.function.name], call.function.arguments, `${what}: ${call.function.name}`);
  }
}

test("chat: tool_choice required and named always call, with valid arguments", async () => {
  const messages = [{ role: "user", content: "What is the weather in Paris, and what is 2 + 3?" }];
  for (const seed of [1, 2, 3]) {
    const required = await openai.chat.completions.create({
      messages, tools, tool_choice: "required", max_tokens: 300, temperature: 1, seed, ...noThinking,
    });
    const c = required.choices[0];
    assertCalls(c.message.tool_calls, `required seed ${seed}`);
    if (c.finish_reason !== "length") assert.equal(c.finish_reason, "tool_calls");
    const named = await openai.chat.completions.create({
      messages, tools, tool_choice: { type: "function", function: { name: "add" } }, max_tokens: 200,
      temperature: 1, seed, ...noThinking,
    });
    assertCalls(named.choices[0].message.tool_calls, `named seed ${seed}`, "add");
    assert.equal(named.choices[0].message.tool_calls.length, 1);
    assert.equal(named.choices[0].finish_reason, "tool_calls");
    // Streaming: the call arrives in deltas that join to the same call.
    const stream = await openai.chat.completions.create({
      messages, tools, tool_choice: { type: "function", function: { name: "get_weather" } }, max_tokens: 200,
      temperature: 1, seed, stream: true, ...noThinking,
    });
    let name = "";
    let args = "";
    for await (const chunk of stream) {
      for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) {
        name += tc.function?.name ?? "";
        args += tc.function?.arguments ?? "";
      }
    }
    assert.equal(name, "get_weather");
    assertValid(argsValid.get_weather, args, `streamed named seed ${seed}`);
  }
  const single = await openai.chat.completions.create({
    messages, tools, tool_choice: "required", parallel_tool_calls: false, max_tokens: 300, temperature: 1, seed: 4,
    ...noThinking,
  });
  assert.equal(single.choices[0].message.tool_calls.length, 1);
  assertCalls(single.choices[0].message.tool_calls, "parallel_tool_calls false");
});

test("chat: tool_choice auto with a strict function: free text, and any call it makes is valid", async () => {
  const messages = [{ role: "user", content: "What is 2 + 3? Use a tool if you need one." }];
  for (const seed of [1, 2, 3]) {
    const r = await openai.chat.completions.create({ messages, tools, max_tokens: 120, temperature: 1, seed, ...noThinking });
    const c = r.choices[0];
    if (c.message.tool_calls?.length) assertCalls(c.message.tool_calls, `auto seed ${seed}`);
    else assert.ok(c.message.content.length > 0, `seed ${seed}: neither text nor a call`);
  }
  const unenforceable = [{ type: "function", function: { name: "f", strict: true,
    parameters: { type: "object", patternProperties: { x: {} } } } }];
  await assert.rejects(
    openai.chat.completions.create({ messages, tools: unenforceable, max_tokens: 5 }),
    (e) => e instanceof BadRequestError && /patternProperties/.test(e.message) && /'f'/.test(e.message));
});

test("messages: tool_choice any and tool always call, with valid input", async () => {
  const atools = anthropicTools;
  for (const seed of [1, 2]) {
    const any = await anthropic.messages.create({
      model: "kiln-demo", max_tokens: 300, temperature: 1, tools: atools, tool_choice: { type: "any" },
      messages: [{ role: "user", content: "Weather in Oslo?" }], seed, thinking: { type: "disabled" },
    });
    const uses = any.content.filter((b) => b.type === "tool_use");
    assert.ok(uses.length >= 1, JSON.stringify(any.content));
    for (const u of uses) assertValid(argsValid[u.name], JSON.stringify(u.input), `any seed ${seed}`);
    const one = await anthropic.messages.create({
      model: "kiln-demo", max_tokens: 200, temperature: 1, tools: atools,
      tool_choice: { type: "tool", name: "add" }, messages: [{ role: "user", content: "2 + 3?" }], seed,
      thinking: { type: "disabled" },
    });
    const calls = one.content.filter((b) => b.type === "tool_use");
    assert.equal(calls.length, 1, JSON.stringify(one.content));
    assert.equal(calls[0].name, "add");
    assertValid(argsValid.add, JSON.stringify(calls[0].input), "tool add");
    assert.equal(one.stop_reason, "tool_use");
  }
});

test("impossible or unsupported requests are 400s that say why", async () => {
  const base = { messages: ask, max_tokens: 5 };
  const rejects = (p, pattern) =>
    assert.rejects(p, (e) => e instanceof BadRequestError && pattern.test(e.message) ? true : assert.fail(e.message));
  await rejects(openai.chat.completions.create({ ...base, response_format: { type: "json_schema", json_schema: {
    name: "bad", schema: { type: "object", properties: { a: { type: "object", patternProperties: { x: {} } } } } } } }),
  /patternProperties.*\/properties\/a/);
  await rejects(openai.chat.completions.create({ ...base, tool_choice: "required" }), /needs 'tools'/);
  await rejects(openai.chat.completions.create({ ...base, tools, tool_choice: { type: "function", function: { name: "nope" } } }),
    /'nope'/);
  await rejects(openai.chat.completions.create({ ...base, structured_outputs: { grammar: "root ::= item" } }),
    /GBNF grammar at line 1, column 10: rule 'item' is used but never defined/);
  await rejects(openai.chat.completions.create({ ...base, structured_outputs: { structural_tag: {} } }),
    /not supported/);
  await rejects(openai.chat.completions.create({ ...base, structured_outputs: { regex: "(a)\\1" } }),
    /structured_outputs.regex/);
  await assert.rejects(
    anthropic.messages.create({ model: "kiln-demo", max_tokens: 5, messages: [{ role: "user", content: "x" }],
                                tool_choice: { type: "any" } }),
    (e) => e.status === 400 && /needs 'tools'/.test(e.message));
});
