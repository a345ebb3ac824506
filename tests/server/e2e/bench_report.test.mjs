// `kiln bench serve --html`: a short real benchmark against the demo model, then its HTML
// report in headless Chromium with every request but the file itself blocked: both SVG
// charts drawn (one line per series, one point per level, tick labels), the summary table
// (one column per level, the JSON's numbers), no script, no console errors, nothing
// fetched. `kiln bench report` rebuilds a page from JSON and escapes what came from the
// server; a malformed report fails naming the field. KILN_SCREENSHOT_DIR=DIR saves
// DIR/bench-report.png (the full page).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { startServer, launchChromium } from "./harness.mjs";

const KILN = process.env.KILN_TEST_SERVER;  // the kiln CLI (with test hooks): bench serve / report too

const LEVELS = [1, 4, 8];
const THROUGHPUT_SERIES = ["output tokens/s", "total tokens/s"];
const LATENCY_SERIES = ["TTFT p50", "TTFT p99", "TPOT p50", "ITL p99"];

let server;
let browser;
let dir;

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-bench-report-"));
  server = await startServer();
  browser = await launchChromium();
});
after(async () => {
  await browser?.close();
  if (server) assert.equal((await server.stop()).code, 0, server.stderr());
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

// Runs the kiln CLI; resolves {code, stdout, stderr} (never rejects on a non-zero exit).
function kiln(args, { timeoutMs = 180000 } = {}) {
  return new Promise((resolve, reject) => {
    execFile(KILN, args, { timeout: timeoutMs, maxBuffer: 1 << 24 }, (err, stdout, stderr) => {
      if (err && typeof err.code !== "number") reject(new Error(`${KILN} ${args.join(" ")}: ${err.message}\n${stderr}`));
      else resolve({ code: err ? err.code : 0, stdout, stderr });
    });
  });
}

// Opens an HTML file offline: any request other than the file itself is aborted and noted.
async function openOffline(file) {
  const url = pathToFileURL(file).href;
  const page = await browser.newPage({ viewport: { width: 820, height: 800 } });
  const seen = { requests: [], blocked: [], consoleErrors: [], dialogs: [] };
  page.on("request", (r) => seen.requests.push(r.url()));
  page.on("console", (m) => m.type() === "error" && seen.consoleErrors.push(m.text()));
  page.on("pageerror", (e) => seen.consoleErrors.push(e.message));
  page.on("dialog", (d) => {
    seen.dialogs.push(d.message());
    d.dismiss();
  });
  await page.route("**", (route) => {
    if (route.request().url() === url) return route.continue();
    seen.blocked.push(route.request().url());
    return route.abort();
  });
  await page.goto(url, { waitUntil: "load" });
  return { page, url, seen };
}

// A chart's series as drawn: name, its polyline's points, its markers.
async function chartSeries(page, id) {
  return page.$$eval(`svg#${id} g.series`, (groups) => groups.map((g) => ({
    name: g.dataset.series,
    polylines: g.querySelectorAll("polyline").length,
    points: g.querySelector("polyline").getAttribute("points").trim().split(/\s+/).map((p) => p.split(",").map(Number)),
    markers: g.querySelectorAll("circle").length,
  })));
}

test("bench serve --html: a self-contained report with both charts and the summary table", async () => {
  const jsonFile = path.join(dir, "bench.json");
  const htmlFile = path.join(dir, "bench.html");
  const run = await kiln(["bench", "serve", "--url", server.url, "--input-len", "32", "--output-len", "16",
                          "--concurrency", LEVELS.join(","), "--num-prompts", "8", "--warmup", "1",
                          "--json", jsonFile, "--html", htmlFile]);
  assert.equal(run.code, 0, run.stderr);
  const report = JSON.parse(fs.readFileSync(jsonFile, "utf8"));
  assert.deepEqual(report.levels.map((l) => l.config.concurrency), LEVELS);
  for (const l of report.levels) assert.equal(l.summary.successful, 8);

  // Nothing in the file could fetch anything, and no per-request data went in.
  const html = fs.readFileSync(htmlFile, "utf8");
  assert.doesNotMatch(html, /<script|\b(src|href)\s*=|url\(|@import|<link|<img|<iframe/i);
  assert.doesNotMatch(html, /http_status/);
  assert.ok(html.length < 64 * 1024, `the page is ${html.length} bytes`);

  const { page, url, seen } = await openOffline(htmlFile);
  assert.equal(await page.evaluate(() => document.scripts.length), 0);
  assert.match(await page.textContent("h1"), /kiln-demo/);
  const setup = await page.textContent("dl.setup");
  assert.ok(setup.includes(server.url), setup);
  assert.match(setup, /input 32 tokens, output 16 tokens/);
  assert.match(setup, /\/v1\/completions/);
  assert.match(setup, /requests per level\s*8/);
  assert.match(setup, /sampling\s*greedy/);
  assert.match(setup, /\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ/);

  for (const [id, names] of [["throughput-chart", THROUGHPUT_SERIES], ["latency-chart", LATENCY_SERIES]]) {
    const svg = page.locator(`svg#${id}`);
    assert.ok(await svg.isVisible(), `${id} is not visible`);
    const box = await svg.boundingBox();
    assert.ok(box.width > 300 && box.height > 150, `${id}: ${JSON.stringify(box)}`);
    assert.ok((await page.textContent(`svg#${id} > title`)).trim().length > 0, `${id} has no title`);
    assert.equal(await page.getAttribute(`svg#${id}`, "role"), "img");

    const series = await chartSeries(page, id);
    assert.deepEqual(series.map((s) => s.name), names);
    for (const s of series) {
      assert.equal(s.polylines, 1, `${id} ${s.name}`);
      assert.equal(s.points.length, LEVELS.length, `${id} ${s.name}: ${JSON.stringify(s.points)}`);
      assert.equal(s.markers, LEVELS.length, `${id} ${s.name}`);
      for (const [x, y] of s.points) assert.ok(Number.isFinite(x) && Number.isFinite(y), `${id} ${s.name}`);
      // Categorical x: the levels left to right, evenly spaced.
      const xs = s.points.map(([x]) => x);
      assert.ok(Math.abs((xs[1] - xs[0]) - (xs[2] - xs[1])) < 0.5 && xs[1] > xs[0], `${id} ${s.name}: ${xs}`);
    }
    const legend = await page.$$eval(`svg#${id} g.legend text`, (ts) => ts.map((t) => t.textContent));
    assert.deepEqual(legend, names);
    const xTicks = await page.$$eval(`svg#${id} text.x-tick`, (ts) => ts.map((t) => t.textContent));
    assert.deepEqual(xTicks, LEVELS.map(String));
    const yTicks = await page.$$eval(`svg#${id} text.y-tick`, (ts) => ts.map((t) => t.textContent));
    assert.ok(yTicks.length >= 3, `${id} y ticks: ${yTicks}`);
    for (const t of yTicks) assert.match(t, /^[\d,]+(\.\d+)?$/, `${id} y tick ${t}`);
    const titles = await page.$$eval(`svg#${id} text.axis-title`, (ts) => ts.map((t) => t.textContent));
    assert.equal(titles.length, 2);
    assert.ok(titles.some((t) => /concurrency/.test(t)), titles.join(" | "));
  }
  // Total tokens/s (input + output) is drawn above output tokens/s at every level (SVG y grows downwards).
  const [output, total] = await chartSeries(page, "throughput-chart");
  for (let i = 0; i < LEVELS.length; ++i) assert.ok(total.points[i][1] < output.points[i][1], `level ${LEVELS[i]}`);

  // The table: a column per level, the numbers of the JSON.
  const heads = await page.$$eval("#summary thead th", (ths) => ths.map((th) => th.textContent));
  assert.deepEqual(heads, ["", ...LEVELS.map((c) => `c=${c}`)]);
  const rows = await page.$$eval("#summary tbody tr", (trs) => trs.map((tr) => ({
    name: tr.querySelector("th").textContent,
    cells: [...tr.querySelectorAll("td")].map((td) => td.textContent),
  })));
  for (const r of rows) assert.equal(r.cells.length, LEVELS.length, r.name);
  const row = (name) => rows.find((r) => r.name === name)?.cells;
  assert.deepEqual(row("successful requests"), report.levels.map((l) => String(l.summary.successful)));
  assert.deepEqual(row("output tokens/s"), report.levels.map((l) => l.summary.output_tokens_per_s.toFixed(1)));
  assert.deepEqual(row("TTFT p99 (ms)"), report.levels.map((l) => l.summary.ttft_ms.p99.toFixed(2)));
  assert.equal(row("draft acceptance (%)"), undefined, "no speculative rows for a server without drafts");
  assert.equal(await page.locator("#errors").count(), 0);

  if (process.env.KILN_SCREENSHOT_DIR) {
    fs.mkdirSync(process.env.KILN_SCREENSHOT_DIR, { recursive: true });
    await page.screenshot({ path: path.join(process.env.KILN_SCREENSHOT_DIR, "bench-report.png"), fullPage: true });
  }
  await page.close();
  assert.deepEqual(seen.consoleErrors, []);
  assert.deepEqual(seen.blocked, []);
  assert.deepEqual(seen.requests, [url]);
});

test("bench report: the page from a JSON file, with the server's strings escaped", async () => {
  const hostile = "<script>alert(1)</script>&\"'";
  const message = "HTTP 500: <img src=x onerror=alert(2)> & more";
  const dist = { mean: 12, p50: 10, p90: 20, p99: 30 };
  const level = (c, failed) => ({
    config: { url: `http://127.0.0.1:1/?q=<b>"x"`, model: hostile, endpoint: "chat", input_len: 64, output_len: 8,
              random_range_ratio: 0, num_requests: 4, concurrency: c, request_rate: null, warmup: 0, seed: 7,
              date: "2026-11-23T10:00:00Z" },
    summary: { successful: 4 - failed, failed, duration_s: 1, input_tokens: 256, output_tokens: 32, requests_per_s: 4,
               output_tokens_per_s: 32 * c, total_tokens_per_s: 288 * c, ttft_ms: dist, tpot_ms: dist, itl_ms: dist,
               e2e_ms: dist, errors: failed ? { [message]: failed } : {} },
  });
  const jsonFile = path.join(dir, "hostile.json");
  const htmlFile = path.join(dir, "hostile.html");
  fs.writeFileSync(jsonFile, JSON.stringify({ levels: [level(1, 0), level(32, 2), level(128, 0)] }));
  const run = await kiln(["bench", "report", "--json", jsonFile, "--html", htmlFile]);
  assert.equal(run.code, 0, run.stderr);

  const { page, url, seen } = await openOffline(htmlFile);
  assert.equal(await page.evaluate(() => document.querySelectorAll("script, img, b").length), 0);
  assert.equal(await page.textContent("h1"), `kiln bench serve: ${hostile}`);
  assert.ok((await page.textContent("dl.setup")).includes(`http://127.0.0.1:1/?q=<b>"x"`));
  assert.match(await page.textContent("dl.setup"), /sampling\s*greedy/);  // (a report from before the option)
  assert.equal(await page.textContent("title"), `kiln bench serve: ${hostile}`);
  const errors = await page.$$eval("#errors tbody tr", (trs) => trs.map((tr) =>
    [...tr.querySelectorAll("td")].map((td) => td.textContent)));
  assert.deepEqual(errors, [["c=32", "2", message]]);
  const xTicks = await page.$$eval("svg#latency-chart text.x-tick", (ts) => ts.map((t) => t.textContent));
  assert.deepEqual(xTicks, ["1", "32", "128"]);
  for (const s of await chartSeries(page, "latency-chart")) assert.equal(s.points.length, 3);
  await page.close();
  assert.deepEqual(seen.dialogs, []);
  assert.deepEqual(seen.consoleErrors, []);
  assert.deepEqual(seen.requests, [url]);
});

test("bench report: speculative decoding's rows where the levels have them", async () => {
  const dist = { mean: 1, p50: 1, p90: 1, p99: 1 };
  const level = (c, spec) => ({
    config: { url: "http://127.0.0.1:1", model: "m", endpoint: "chat", input_len: 64, output_len: 8,
              num_requests: 4, concurrency: c, seed: 1, date: "2026-11-29T10:00:00Z" },
    summary: { successful: 4, failed: 0, duration_s: 1, input_tokens: 256, output_tokens: 32, requests_per_s: 4,
               output_tokens_per_s: 32, total_tokens_per_s: 288, ttft_ms: dist, tpot_ms: dist, itl_ms: dist,
               e2e_ms: dist, errors: {}, ...(spec ? { speculative: spec } : {}) },
  });
  const spec = { drafts: 120, draft_tokens: 360, accepted_tokens: 225, acceptance: 0.625, mean_accepted_length: 2.875 };
  const jsonFile = path.join(dir, "spec.json");
  const htmlFile = path.join(dir, "spec.html");
  fs.writeFileSync(jsonFile, JSON.stringify({ levels: [level(1, spec), level(8, null)] }));
  const run = await kiln(["bench", "report", "--json", jsonFile, "--html", htmlFile]);
  assert.equal(run.code, 0, run.stderr);
  const { page, seen } = await openOffline(htmlFile);
  const rows = await page.$$eval("#summary tbody tr", (trs) => trs.map((tr) => [
    tr.querySelector("th").textContent, ...[...tr.querySelectorAll("td")].map((td) => td.textContent)]));
  const row = (name) => rows.find((r) => r[0] === name)?.slice(1);
  assert.deepEqual(row("draft acceptance (%)"), ["62.5", "0.0"]);
  assert.deepEqual(row("mean accepted length"), ["2.88", "0.00"]);
  assert.deepEqual(row("verified drafts"), ["120", "0"]);
  await page.close();
  assert.deepEqual(seen.consoleErrors, []);
  // A malformed speculative block fails naming its field.
  fs.writeFileSync(jsonFile, JSON.stringify({ levels: [level(1, { ...spec, acceptance: "high" })] }));
  const bad = await kiln(["bench", "report", "--json", jsonFile, "--html", htmlFile]);
  assert.notEqual(bad.code, 0);
  assert.match(bad.stderr, /levels\[0\]\.summary\.speculative\.acceptance: expected a number/);
});

test("bench report: a file that is not a report fails naming the field", async () => {
  const bad = path.join(dir, "bad.json");
  const out = path.join(dir, "bad.html");
  fs.writeFileSync(bad, JSON.stringify({ levels: [{ config: { url: "u", model: "m", endpoint: "completions",
    input_len: 1, output_len: 1, num_requests: 1, concurrency: 1 }, summary: { successful: 1 } }] }));
  let run = await kiln(["bench", "report", "--json", bad, "--html", out]);
  assert.equal(run.code, 1);
  assert.match(run.stderr, /bad\.json: levels\[0\]\.summary\.failed: expected a number/);
  assert.ok(!fs.existsSync(out));

  fs.writeFileSync(bad, "{ not json");
  run = await kiln(["bench", "report", "--json", bad, "--html", out]);
  assert.equal(run.code, 1);
  assert.match(run.stderr, /bad\.json: not valid JSON at line 1, column 4: .*\(expected a report of kiln bench serve --json\)/);
  run = await kiln(["bench", "report", "--json", path.join(dir, "missing.json"), "--html", out]);
  assert.equal(run.code, 1);
  assert.match(run.stderr, /cannot read .*missing\.json/);
});
