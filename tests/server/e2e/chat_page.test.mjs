// The chat page at / in headless Chromium (Debian's, driven by playwright-core): it names
// the model, streams a typed message's reply with its tokens/s, shows reasoning apart from
// the answer, and its Stop button ends a reply (the server frees its blocks); no console
// errors. KILN_SCREENSHOT=FILE saves a screenshot of the page after a reply.
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

async function openPage() {
  const page = await browser.newPage({ viewport: { width: 960, height: 720 } });
  page.on("console", (m) => m.type() === "error" && consoleErrors.push(m.text()));
  page.on("pageerror", (e) => consoleErrors.push(e.message));
  await page.goto(server.url + "/");
  await page.waitForFunction(() => document.getElementById("model").textContent === "kiln-demo", null, { timeout: 20000 });
  return page;
}

// Sends `text` and waits until the reply is complete (the Stop button is gone again).
async function ask(page, text) {
  await page.fill("#input", text);
  await page.press("#input", "Enter");
  await page.waitForSelector("#stop", { state: "visible", timeout: 10000 }).catch(() => {});
  await page.waitForSelector("#stop", { state: "hidden", timeout: 60000 });
  return page.locator(".msg.assistant").last();
}

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
  if (process.env.KILN_SCREENSHOT) await page.screenshot({ path: process.env.KILN_SCREENSHOT });
  await page.close();
  assert.deepEqual(consoleErrors, []);
});

test("reasoning is shown apart from the answer", async () => {
  const page = await openPage();
  // The test hook: the model's output for this request is injected (kiln_test_server only).
  await page.route("**/v1/chat/completions", (route) =>
    route.continue({
      headers: {
        ...route.request().headers(),
        "x-kiln-test-output": encodeURIComponent("<think>\nThe user greets me.\n</think>\n\nHello there!<|im_end|>"),
      },
    }));
  const reply = await ask(page, "Hi");
  assert.equal(await reply.locator("details.reasoning div").textContent(), "The user greets me.");
  assert.equal(await reply.locator(".content").textContent(), "Hello there!");
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
