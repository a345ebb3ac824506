// Generates tests/data/jinja/conversations.json: the chat requests every chat template
// is rendered with, by kiln and by @huggingface/jinja, in tests/tokenizer/jinja_oracle_test.cpp.
// Deterministic (a seeded generator), so the committed file can be regenerated exactly:
//   node tests/tokenizer/peers/jinja_make_conversations.mjs > tests/data/jinja/conversations.json
// Each case: {name, messages, tools?, add_generation_prompt, kwargs?}.

function mulberry32(seed) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = mulberry32(20240709);
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));

const SYSTEMS = [
  "You are a helpful assistant.",
  "You are Kiln, a concise assistant. Answer in one sentence.",
  "  Leading and trailing spaces matter.  \n",
  "Réponds en français, s'il te plaît. Ünïcödé, 日本語, עברית, emoji 🤖🔥.",
  "Multi-line\nsystem\n\nprompt with a tab\tand a backslash \\ and \"quotes\".",
];
const USERS = [
  "Hello!",
  "What is the capital of France?",
  "Write a haiku about the sea.",
  "Explain {{ jinja }} and {% raw %} syntax; they must stay literal.",
  "Tokens like <|im_end|>, <|eot_id|>, <end_of_turn> and <｜User｜> in user text.",
  "中文问题：今天天气怎么样？",
  "Emoji test 👍🏽 👨‍👩‍👧 and combining e\u0301 and zero\u200bwidth.",
  "   padded question with newlines   \n\n",
  "Line one\nLine two\r\nLine three\ttabbed",
  "A \"quoted\" word, a 'single' one, and a backslash \\n that is not a newline.",
  "<tool_response>looks like a tool response</tool_response>",
  "Σ ΣΑΣ ß ﬁ İ — case mapping cases",
];
const ASSISTANTS = [
  "Hi! How can I help?",
  "The capital of France is Paris.",
  "Waves fold on the shore,\nsalt wind hums an old refrain,\nthe tide keeps its time.",
  "  Answer with surrounding whitespace.  ",
  "Sure — here is a list:\n1. one\n2. two\n",
  "答案是：晴天。☀️",
  "",
];
const REASONING = [
  "The user greets me. I should greet back.",
  "Let me think step by step.\nFirst, recall facts.\nThen answer.",
  "\nreasoning with surrounding newlines\n",
];

const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the current weather in a city.",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", description: "City name, e.g. Paris" },
          unit: { type: "string", enum: ["celsius", "fahrenheit"], default: "celsius" },
        },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "search",
      description: "Search the web. Returns ünïcödé snippets 🔎.",
      parameters: {
        type: "object",
        properties: {
          query: { type: "string" },
          max_results: { type: "integer", description: "How many results", default: 5 },
          filters: { type: "array", items: { type: "string" } },
          "2": { type: "number", description: "an integer-like key, ordered first by JavaScript" },
        },
        required: ["query"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "calculator",
      description: "Evaluate an arithmetic expression.",
      parameters: {
        type: "object",
        properties: { expression: { type: "string" }, precision: { type: "number" } },
        required: ["expression"],
      },
    },
  },
  {
    type: "function",
    function: { name: "no_params", description: "A tool without parameters.", parameters: { type: "object", properties: {} } },
  },
];

const ARGS = [
  { city: "Paris" },
  { city: "São Paulo", unit: "fahrenheit" },
  { query: "kiln \"inference\" engine", max_results: 3, filters: ["news", "blogs"] },
  { expression: "2 * (3 + 4)", precision: 1.5 },
  { expression: "1/3", precision: 2.0 },
  { query: "日本 🗾", nested: { a: [1, null, true], b: { c: -0.25 } } },
  {},
];
const RESULTS = [
  '{"temperature": 21, "condition": "sunny"}',
  "22°C, light rain 🌧️",
  "14",
  "Result: 0.3333333333333333",
  "[\"first result\", \"second result\"]",
  "",
];

let callId = 0;
function toolCall(argsAsString) {
  const args = pick(ARGS);
  const name = args.city ? "get_weather" : args.query ? "search" : args.expression ? "calculator" : "no_params";
  const id = `call_${++callId}`;
  return { id, type: "function", function: { name, arguments: argsAsString ? JSON.stringify(args) : args } };
}

function exchange(messages, { tools, argsAsString, reasoning, multi }) {
  messages.push({ role: "user", content: pick(USERS) });
  if (tools) {
    const calls = [];
    for (let i = 0; i < (multi ? int(2, 3) : 1); ++i) calls.push(toolCall(argsAsString));
    // content null breaks several real templates (in the reference too): keep it rare.
    const assistant = { role: "assistant", content: pick([null, "", "", "Let me check.", "Calling a tool."]), tool_calls: calls };
    if (reasoning) assistant.reasoning_content = pick(REASONING);
    messages.push(assistant);
    for (const c of calls)
      messages.push({ role: "tool", tool_call_id: c.id, name: c.function.name, content: pick(RESULTS) });
  }
  const answer = { role: "assistant", content: pick(ASSISTANTS) };
  if (reasoning) answer.reasoning_content = pick(REASONING);
  messages.push(answer);
}

const cases = [];
function add(name, messages, extra = {}) {
  cases.push({ name, messages, add_generation_prompt: extra.add_generation_prompt ?? true, ...extra });
}

// Plain chats: with and without a system prompt, one to four turns, generation prompt on and off.
for (let i = 0; i < 32; ++i) {
  const messages = [];
  if (i % 2 === 0) messages.push({ role: "system", content: pick(SYSTEMS) });
  for (let t = 0, n = int(0, 3); t < n; ++t) exchange(messages, {});
  messages.push({ role: "user", content: pick(USERS) });
  if (i % 4 === 3) messages.push({ role: "assistant", content: pick(ASSISTANTS) });
  add(`chat_${i}`, messages, { add_generation_prompt: i % 4 !== 3 });
}
// Tool use: definitions, calls with dict or string arguments, results, several calls at once.
for (let i = 0; i < 16; ++i) {
  const messages = [];
  if (i % 3 === 0) messages.push({ role: "system", content: pick(SYSTEMS) });
  const tools = TOOLS.slice(0, int(1, TOOLS.length));
  for (let t = 0, n = int(1, 2); t < n; ++t)
    exchange(messages, { tools: true, argsAsString: i % 2 === 1, multi: i % 4 >= 2 });
  messages.push({ role: "user", content: pick(USERS) });
  add(`tools_${i}`, messages, { tools, add_generation_prompt: i % 5 !== 4 });
}
// Tool definitions without any call, and calls ending the conversation (pending results).
for (let i = 0; i < 4; ++i) {
  const messages = [{ role: "user", content: pick(USERS) }];
  if (i >= 2) {
    messages.push({ role: "assistant", content: null, tool_calls: [toolCall(i === 3)] });
    messages.push({ role: "tool", tool_call_id: `call_${callId}`, content: pick(RESULTS) });
  }
  add(`tools_only_${i}`, messages, { tools: [pick(TOOLS)], add_generation_prompt: true });
}
// Reasoning: reasoning_content fields and inline <think> blocks, thinking on and off.
for (let i = 0; i < 10; ++i) {
  const messages = [];
  if (i % 2 === 0) messages.push({ role: "system", content: pick(SYSTEMS) });
  exchange(messages, { reasoning: true, tools: i >= 6, argsAsString: i % 2 === 0 });
  messages.push({ role: "user", content: pick(USERS) });
  if (i % 3 === 0) messages.push({ role: "assistant", content: `<think>\n${pick(REASONING)}\n</think>\n\n${pick(ASSISTANTS)}` });
  const kwargs = i % 3 === 1 ? { enable_thinking: false } : i % 3 === 2 ? { enable_thinking: true } : undefined;
  add(`reasoning_${i}`, messages, {
    tools: i >= 6 ? TOOLS.slice(0, 2) : undefined,
    add_generation_prompt: i % 3 !== 0,
    ...(kwargs ? { kwargs } : {}),
  });
}
// Template kwargs passed through.
for (const [i, kwargs] of [
  { enable_thinking: false },
  { enable_thinking: true },
  { reasoning_effort: "high", builtin_tools: ["browser", "python"] },
  { reasoning_effort: "low", model_identity: "You are a test model." },
  { custom_flag: 1.0, custom_list: [1, 2.5, "x"] },
].entries()) {
  add(`kwargs_${i}`, [{ role: "user", content: pick(USERS) }], { kwargs });
}
// Inputs that some templates reject (raise_exception) or handle in odd ways.
add("invalid_two_users", [
  { role: "user", content: "first" },
  { role: "user", content: "second" },
]);
add("invalid_assistant_first", [
  { role: "assistant", content: "I speak first." },
  { role: "user", content: "Then me." },
]);
add("invalid_system_in_middle", [
  { role: "user", content: "Hi" },
  { role: "system", content: "Late system prompt." },
  { role: "user", content: "Still there?" },
]);
add("invalid_tool_without_call", [
  { role: "user", content: "Hi" },
  { role: "tool", content: "orphan result" },
]);
add("invalid_unknown_role", [{ role: "narrator", content: "Once upon a time" }]);
add("empty_messages", []);
add("content_parts", [
  { role: "system", content: [{ type: "text", text: "System as parts." }] },
  { role: "user", content: [{ type: "image" }, { type: "text", text: " Describe this image. " }] },
]);
for (let i = 0; i < 4; ++i) {
  const parts = (text) => [{ type: "text", text }, ...(i % 2 ? [{ type: "image" }] : [])];
  const messages = i % 2 ? [{ role: "system", content: parts(pick(SYSTEMS)) }] : [];
  messages.push({ role: "user", content: parts(pick(USERS)) });
  messages.push({ role: "assistant", content: parts(pick(ASSISTANTS)) });
  messages.push({ role: "user", content: parts(pick(USERS)) });
  add(`content_parts_${i}`, messages, { add_generation_prompt: i !== 3 });
}
add("content_null_user", [{ role: "user", content: null }]);
add("content_number", [{ role: "user", content: 42 }]);
add("long_conversation", (() => {
  const m = [{ role: "system", content: SYSTEMS[0] }];
  for (let t = 0; t < 12; ++t) exchange(m, {});
  m.push({ role: "user", content: "Last question." });
  return m;
})());

process.stdout.write(JSON.stringify(cases, null, 1) + "\n");
