// The chat page at / in headless Chromium (Debian's, driven by playwright-core): it names
// the model, streams a typed message's reply with its tokens/s, shows reasoning apart from
// the answer, and its Stop button ends a reply (the server frees its blocks). Replies are
// rendered as Markdown (code blocks with their language, lists, links) and what is not
// rendered stays text (model HTML never runs); Copy buttons copy a code block and a whole
// message; conversations live in localStorage (a reload restores them, the sidebar switches
// and deletes); the system prompt, Edit, Regenerate and the sampling settings send the
// right request; a server with --api-key gets its key asked for. No console errors.
// KILN_SCREENSHOT=FILE saves a screenshot of a conversation with a code block (the one in
// docs/images/chat-page.png).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, launchChromium, metric, eventually } from "./harness.mjs";


let server;
let browser;
const consoleErrors = [];

before(async () => {
  server = await startServer();
  browser = await launchChromium();
});
after(async () => {
  await browser?.close();
  assert.equal((await server.stop()).code, 0, server.stderr());
});

// A page in a fresh browser context (its own localStorage).
async function openPage({ url = server.url, viewport = { width: 960, height: 720 }, waitModel = true } = {}) {
  const page = await browser.newPage({ viewport });
  page.setDefaultTimeout(20000);
  page.on("console", (m) => m.type() === "error" && consoleErrors.push(m.text()));
  page.on("pageerror", (e) => consoleErrors.push(e.message));
  await page.goto(url + "/");
  if (waitModel) await modelShown(page);
  return page;
}

const modelShown = (page) =>
  page.waitForFunction(() => document.getElementById("model").textContent === "kiln-demo", null, { timeout: 20000 });

// Waits until a reply is complete. Sending (Enter, a click) marks the page busy before the
// event returns, so what is not busy any more is done.
async function settle(page) {
  await page.waitForFunction(() => !document.body.classList.contains("busy"), null, { timeout: 60000 });
  assert.ok(await page.isHidden("#stop"));
}

// Sends `text` and waits until the reply is complete.
async function ask(page, text) {
  await page.fill("#input", text);
  await page.press("#input", "Enter");
  await settle(page);
  return page.locator(".msg.assistant").last();
}

// Records the body of every chat request; the model's output for the next requests is
// `outputs` in turn (the test hook of kiln_test_server; the server streams it as tokens).
async function intercept(page, outputs = []) {
  const requests = [];
  await page.route("**/v1/chat/completions", (route) => {
    const request = route.request();
    requests.push({ body: JSON.parse(request.postData()), headers: request.headers() });
    const headers = { ...request.headers() };
    const output = outputs.shift();
    if (output !== undefined) headers["x-kiln-test-output"] = encodeURIComponent(output + "<|im_end|>");
    route.continue({ headers });
  });
  return requests;
}

const roles = (body) => body.messages.map((m) => `${m.role}: ${m.content}`);
const texts = (locator) => locator.evaluateAll((els) => els.map((e) => e.textContent));

test("a typed message gets a streamed reply, with tokens/s", async () => {
  const page = await openPage();
  const reply = await ask(page, "Tell me a short story.");
  const text = await reply.locator(".content").textContent();
  assert.ok(text.trim().length > 0, "the reply is empty");
  assert.match(await page.textContent("#stats"), /tok\/s · \d+ tokens/);
  assert.equal(await page.locator(".msg.user .content").first().textContent(), "Tell me a short story.");
  // A second turn sends the conversation so far.
  const second = await ask(page, "And another one?");
  assert.ok((await second.locator(".content").textContent()).trim().length > 0);
  assert.equal(await page.locator(".msg").count(), 4);
  await page.close();
  assert.deepEqual(consoleErrors, []);
});

test("reasoning is shown apart from the answer", async () => {
  const page = await openPage();
  await intercept(page, ["<think>\nThe user greets me.\n</think>\n\nHello there!"]);
  const reply = await ask(page, "Hi");
  assert.equal(await reply.locator("details.reasoning div").textContent(), "The user greets me.");
  assert.equal(await reply.locator(".content").textContent(), "Hello there!");
  // Kept with the conversation: there after a reload too.
  await page.reload();
  await modelShown(page);
  assert.equal(await page.locator(".msg.assistant details.reasoning div").textContent(), "The user greets me.");
  await page.close();
  assert.deepEqual(consoleErrors, []);
});

test("Stop ends a reply and the server frees its blocks", async () => {
  const page = await openPage();
  // A reply that would run long: no end of sequence, 1,500 tokens.
  await page.route("**/v1/chat/completions", (route) => {
    const body = JSON.parse(route.request().postData());
    route.continue({ postData: JSON.stringify({ ...body, max_tokens: 1500, ignore_eos: true }) });
  });
  await page.fill("#input", "Go on and on.");
  await page.press("#input", "Enter");
  await page.waitForFunction(() => document.querySelector(".msg.assistant .content")?.textContent.length > 20, null,
                             { timeout: 30000 });
  await page.click("#stop");
  await page.waitForSelector("#stop", { state: "hidden", timeout: 10000 });
  assert.equal(await page.locator(".msg.assistant .note").textContent(), "stopped");
  await eventually(async () => (await metric(server.url, "kiln_kv_cache_blocks_used")) === 0, { what: "free blocks" });
  assert.ok((await metric(server.url, "kiln_request_success_total", 'finished_reason="cancelled"')) >= 1);
  // The page goes on working after a stop.
  await page.unroute("**/v1/chat/completions");
  const next = await ask(page, "Hello?");
  assert.ok((await next.locator(".content").textContent()).trim().length > 0);
  await page.close();
  assert.deepEqual(consoleErrors, []);
});

const CODE = 'import json\n\nwith open("data.json") as f:\n    data = json.load(f)\nprint(data["name"])';
const MARKDOWN = [
  "## Reading JSON",
  "",
  "Use the **json** module's *load* function, or `json.loads` for a string:",
  "",
  "```python",
  CODE,
  "```",
  "",
  "1. Open the file",
  "2. Call `json.load`",
  "   - it returns *dicts* and lists",
  "",
  "- see [the docs](https://docs.python.org/3/library/json.html)",
  "- or <https://docs.python.org/3/tutorial/inputoutput.html>",
  "",
  "> Errors raise json.JSONDecodeError.",
].join("\n");
const TABLE = "Sizes:\n| name | size |\n|:-----|-----:|\n| `a.txt` | 12 |\n| <b>x</b> \\| y | 3 |\n\nThat is all.";
const HOSTILE = 'Look: <img src=x onerror="window.pwned=1"> and <script>window.pwned=2</script> ' +
                "<b>not bold</b> [x](javascript:window.pwned=3) <javascript:window.pwned=4> &amp; done";

test("replies are rendered as Markdown, and model HTML stays text", async () => {
  const page = await openPage({ viewport: { width: 1120, height: 800 } });
  // Two conversations with the demo model first, for the sidebar.
  await ask(page, "Tell me a short story.");
  await page.click("#new");
  await ask(page, "What is the json module for?");
  await intercept(page, [MARKDOWN, HOSTILE, TABLE]);
  const reply = await ask(page, "How do I read a JSON file in Python?");
  const content = reply.locator(".content");
  assert.equal(await content.locator("h2").textContent(), "Reading JSON");
  assert.equal(await content.locator("p strong").first().textContent(), "json");
  assert.equal(await content.locator("p em").first().textContent(), "load");
  assert.equal(await content.locator("p > code").first().textContent(), "json.loads");
  assert.equal(await content.locator(".code .lang").textContent(), "python");
  assert.equal(await content.locator(".code pre code").textContent(), CODE);
  assert.deepEqual(await texts(content.locator("ol > li > p")), ["Open the file", "Call json.load"]);
  assert.equal(await content.locator("ol > li ul > li em").textContent(), "dicts");
  const link = content.locator("a");
  assert.deepEqual(await link.evaluateAll((as) => as.map((a) => [a.textContent, a.href, a.rel])), [
    ["the docs", "https://docs.python.org/3/library/json.html", "noopener noreferrer"],
    ["https://docs.python.org/3/tutorial/inputoutput.html", "https://docs.python.org/3/tutorial/inputoutput.html",
     "noopener noreferrer"],
  ]);
  assert.equal(await content.locator("blockquote").textContent(), "Errors raise json.JSONDecodeError.");
  assert.equal(await page.locator("#conversations li").count(), 2);
  if (process.env.KILN_SCREENSHOT) {
    await page.mouse.move(700, 740);
    await page.screenshot({ path: process.env.KILN_SCREENSHOT });
  }

  // Markup from the model is shown as it is, and none of it runs.
  const hostile = await ask(page, "Write some HTML.");
  const h = hostile.locator(".content");
  assert.equal(await h.textContent(), HOSTILE);
  assert.equal(await h.locator("img, script, b, a").count(), 0);
  assert.equal(await page.evaluate(() => window.pwned), undefined);

  const table = (await ask(page, "A table, please.")).locator(".content table");
  assert.deepEqual(await texts(table.locator("th")), ["name", "size"]);
  assert.deepEqual(await texts(table.locator("td")), ["a.txt", "12", "<b>x</b> | y", "3"]);
  assert.equal(await table.locator("td code").textContent(), "a.txt");
  assert.deepEqual(await table.locator("td").evaluateAll((tds) => tds.map((td) => td.style.textAlign)),
                   ["", "right", "", "right"]);
  assert.equal(await table.locator("b").count(), 0);
  await page.close();
  assert.deepEqual(consoleErrors, []);
});

test("Copy puts a code block, or a whole message, on the clipboard", async () => {
  const page = await openPage();
  await page.context().grantPermissions(["clipboard-read", "clipboard-write"], { origin: server.url });
  await intercept(page, ["Here:\n\n```sh\nls -la /tmp\n```\n\nDone."]);
  const reply = await ask(page, "How do I list files?");
  await reply.locator(".copy-code").click();
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), "ls -la /tmp");
  await eventually(async () => (await reply.locator(".copy-code").textContent()) === "Copied", { what: "Copied" });
  await reply.locator(".copy-msg").click();
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), "Here:\n\n```sh\nls -la /tmp\n```\n\nDone.");
  await page.locator(".msg.user .copy-msg").click();
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), "How do I list files?");
  await page.close();
  assert.deepEqual(consoleErrors, []);
});

test("conversations survive a reload; the sidebar switches between them and deletes them", async () => {
  const page = await openPage();
  await intercept(page, ["Apples are red.", "Pears are green.", "Plums are purple."]);
  await ask(page, "Tell me about apples, and then about many other fruits too please");
  await page.click("#new");
  assert.equal(await page.locator(".msg").count(), 0);
  await ask(page, "Pears?");
  await ask(page, "Plums?");
  const titles = () => texts(page.locator("#conversations .open"));
  assert.deepEqual(await titles(), ["Pears?", "Tell me about apples, and then about many other…"]);

  await page.reload();
  await modelShown(page);
  assert.deepEqual(await titles(), ["Pears?", "Tell me about apples, and then about many other…"]);
  assert.equal(await page.locator("#conversations li.current .open").textContent(), "Pears?");
  assert.deepEqual(await texts(page.locator(".msg .content")), ["Pears?", "Pears are green.", "Plums?", "Plums are purple."]);

  await page.click("#conversations li:nth-child(2) .open");
  assert.deepEqual(await texts(page.locator(".msg .content")),
                   ["Tell me about apples, and then about many other fruits too please", "Apples are red."]);
  assert.equal(await page.locator("#conversations li.current .open").textContent(), "Tell me about apples, and then about many other…");
  // Deleting another conversation keeps this one on screen.
  await page.click("#conversations li:nth-child(1) .delete");
  assert.deepEqual(await titles(), ["Tell me about apples, and then about many other…"]);
  assert.equal(await page.locator(".msg").count(), 2);
  await page.reload();
  await modelShown(page);
  assert.deepEqual(await titles(), ["Tell me about apples, and then about many other…"]);
  assert.equal(await page.locator(".msg").count(), 2);
  // Deleting the open one leaves an empty conversation.
  await page.click("#conversations li.current .delete");
  assert.equal(await page.locator("#conversations li").count(), 0);
  assert.equal(await page.locator(".msg").count(), 0);
  assert.ok(await page.isVisible("#empty"));
  await page.reload();
  await modelShown(page);
  assert.equal(await page.locator("#conversations li").count(), 0);
  await page.close();
  assert.deepEqual(consoleErrors, []);
});

test("the system prompt is sent first, and kept with its conversation", async () => {
  const page = await openPage();
  const requests = await intercept(page, ["Arr, hello.", "Arr."]);
  await page.click("#settings summary");
  await page.fill("#system", "You are a pirate.");
  await ask(page, "Hello");
  assert.deepEqual(roles(requests[0].body), ["system: You are a pirate.", "user: Hello"]);
  assert.match(await page.textContent(".system-note"), /You are a pirate\./);
  await page.reload();
  await modelShown(page);
  assert.equal(await page.inputValue("#system"), "You are a pirate.");
  await ask(page, "Again");
  assert.deepEqual(roles(requests[1].body),
                   ["system: You are a pirate.", "user: Hello", "assistant: Arr, hello.", "user: Again"]);
  // None: no system message.
  await page.click("#new");
  await page.click("#settings summary");
  await page.fill("#system", "");
  await ask(page, "Plain");
  assert.deepEqual(roles(requests[2].body), ["user: Plain"]);
  await page.close();
  assert.deepEqual(consoleErrors, []);
});

test("Regenerate asks again for the last reply; Edit replaces a message and drops what followed", async () => {
  const page = await openPage();
  const requests = await intercept(page, ["One.", "Two.", "Two, again.", "Three."]);
  await ask(page, "First");
  await ask(page, "Second");
  // Regenerate is on the last reply only.
  assert.deepEqual(await page.locator(".msg.assistant .regen").evaluateAll((els) => els.map((e) => e.hidden)), [true, false]);
  await page.locator(".msg.assistant .regen").last().click();
  await settle(page);
  assert.deepEqual(roles(requests[2].body), ["user: First", "assistant: One.", "user: Second"]);
  assert.deepEqual(await texts(page.locator(".msg .content")), ["First", "One.", "Second", "Two, again."]);

  await page.locator(".msg.user .edit").first().click();
  await page.fill(".msg.user .edit-box", "First, changed");
  await page.click(".msg.user .edit-send");
  await settle(page);
  assert.deepEqual(roles(requests[3].body), ["user: First, changed"]);
  assert.deepEqual(await texts(page.locator(".msg .content")), ["First, changed", "Three."]);
  assert.equal(await page.textContent("#conversations li.current .open"), "First, changed");
  await page.reload();
  await modelShown(page);
  assert.deepEqual(await texts(page.locator(".msg .content")), ["First, changed", "Three."]);
  await page.close();
  assert.deepEqual(consoleErrors, []);
});

test("the settings are sent with the request and kept", async () => {
  const page = await openPage();
  const requests = await intercept(page, ["Ok.", "Ok.", "Ok."]);
  await ask(page, "Defaults");
  const first = requests[0].body;
  assert.equal(first.max_tokens, 256);
  for (const name of ["temperature", "top_p", "seed"]) assert.ok(!(name in first), `${name} sent unset`);

  await page.click("#settings summary");
  await page.fill("#temperature", "0.3");
  await page.fill("#top_p", "0.8");
  await page.fill("#max_tokens", "40");
  await page.fill("#seed", "7");
  await ask(page, "Set");
  const { temperature, top_p, max_tokens, seed } = requests[1].body;
  assert.deepEqual({ temperature, top_p, max_tokens, seed }, { temperature: 0.3, top_p: 0.8, max_tokens: 40, seed: 7 });

  await page.reload();
  await modelShown(page);
  assert.deepEqual(await Promise.all(["#temperature", "#top_p", "#max_tokens", "#seed"].map((s) => page.inputValue(s))),
                   ["0.3", "0.8", "40", "7"]);
  await page.click("#settings summary");
  await page.fill("#seed", "");
  await ask(page, "No seed");
  assert.ok(!("seed" in requests[2].body));
  assert.equal(requests[2].body.temperature, 0.3);
  await page.close();
  assert.deepEqual(consoleErrors, []);
});

test("a server with an API key: the page asks for the key, then gets a reply", async () => {
  const keyed = await startServer(["--api-key", "kiln-e2e-key"]);
  const errors = consoleErrors.length;
  try {
    const page = await openPage({ url: keyed.url, waitModel: false });
    // Asked at once (GET /v1/models answered 401); Cancel leaves the page saying so.
    await page.waitForSelector("#key-dialog[open]");
    assert.match(await page.textContent("#key-message"), /needs an API key/);
    await page.click("#key-cancel");
    await page.waitForFunction(() => document.getElementById("model").textContent === "API key needed");
    // Send asks again rather than doing nothing; a wrong key is refused and asked for again.
    const requests = await intercept(page);
    await page.fill("#input", "Tell me a short story.");
    await page.press("#input", "Enter");
    await page.waitForSelector("#key-dialog[open]");
    await page.fill("#key-input", "wrong");
    await page.click("#key-ok");
    await page.waitForFunction(() => /refused/.test(document.getElementById("key-message").textContent) &&
                                     document.getElementById("key-dialog").open);
    await page.fill("#key-input", "kiln-e2e-key");
    await page.click("#key-ok");
    await settle(page);
    await modelShown(page);
    const reply = page.locator(".msg.assistant").last();
    assert.ok((await reply.locator(".content").textContent()).trim().length > 0, "no reply");
    assert.equal(await page.locator(".msg.error").count(), 0);
    assert.equal(requests.at(-1).headers.authorization, "Bearer kiln-e2e-key");
    // Kept: a reload asks nothing.
    await page.reload();
    await modelShown(page);
    assert.equal(await page.locator("#key-dialog[open]").count(), 0);
    assert.equal(await page.inputValue("#key"), "kiln-e2e-key");
    await page.close();
  } finally {
    assert.equal((await keyed.stop()).code, 0, keyed.stderr());
  }
  // The browser logs each 401 response itself ("Failed to load resource"); nothing else.
  const rest = consoleErrors.splice(errors).filter((e) => !/status of 401/.test(e));
  assert.deepEqual(rest, []);
  assert.deepEqual(consoleErrors, []);
});
