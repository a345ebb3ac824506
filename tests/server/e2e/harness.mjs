// Starts kiln_test_server (kiln with its test hooks) on a free port of 127.0.0.1 and stops
// it again; loads the npm peers (the official SDK clients). Every wait is bounded.
//
//   const server = await startServer(["--max-num-seqs", "64"]);
//   ... fetch(server.url + "/v1/models") ...
//   await server.stop();
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const nodePath = (process.env.NODE_PATH || "").split(path.delimiter).filter(Boolean)[0];
if (!nodePath) throw new Error("set NODE_PATH to the npm peers (scripts/node-test does)");
export const requirePeer = createRequire(path.join(nodePath, "noop.js"));

const binary = process.env.KILN_TEST_SERVER;
if (!binary) throw new Error("set KILN_TEST_SERVER to the kiln_test_server binary");

const running = new Set();
process.on("exit", () => {
  for (const p of running) p.kill("SIGKILL");
});

// KILN_TEST_SERVER_ARGS: more arguments for every server a test starts (CMake runs the
// API tests again with "--tensor-parallel-size 2").
const extraArgs = (process.env.KILN_TEST_SERVER_ARGS ?? "").split(/\s+/).filter(Boolean);

// env: more environment variables for this server (KILN_LOG: "info").
export async function startServer(args = [], { timeoutMs = 120000, env = {} } = {}) {
  const proc = spawn(binary, ["serve", "--port", "0", "--threads", "2", ...args, ...extraArgs], {
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  running.add(proc);
  let stdout = "";
  let stderr = "";
  proc.stderr.on("data", (d) => (stderr += d));
  const ready = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`kiln did not get ready in ${timeoutMs} ms:\n${stderr}`)), timeoutMs);
    proc.stdout.on("data", (d) => {
      stdout += d;
      const m = stdout.match(/serving (\S+) at (http:\/\/[\d.]+:\d+)\/v1/);
      if (m) {
        clearTimeout(timer);
        resolve({ model: m[1], url: m[2] });
      }
    });
    proc.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`kiln exited with ${code} before it was ready:\n${stderr}`));
    });
    proc.on("error", (err) => {
      clearTimeout(timer);
      reject(new Error(`cannot start ${binary}: ${err.message}`));
    });
  });
  const exited = new Promise((resolve) => proc.on("exit", (code, signal) => resolve({ code, signal })));
  return {
    ...ready,
    proc,
    stderr: () => stderr,
    exited,
    // SIGTERM (the server drains and exits 0), then SIGKILL if it does not.
    async stop({ timeoutMs: t = 30000 } = {}) {
      if (proc.exitCode !== null) return { code: proc.exitCode };
      proc.kill("SIGTERM");
      const timer = setTimeout(() => proc.kill("SIGKILL"), t);
      const result = await exited;
      clearTimeout(timer);
      running.delete(proc);
      return result;
    },
  };
}

// The value of a Prometheus metric (the first sample whose labels contain `labels`).
export async function metric(url, name, labels = "") {
  const text = await (await fetch(url + "/metrics")).text();
  for (const line of text.split("\n")) {
    if (!line.startsWith(name + "{")) continue;
    if (labels && !line.includes(labels)) continue;
    return Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  throw new Error(`no metric ${name}${labels ? " with " + labels : ""}`);
}

// Polls until fn() is truthy (or throws after timeoutMs).
export async function eventually(fn, { timeoutMs = 20000, what = "condition" } = {}) {
  const until = Date.now() + timeoutMs;
  let last;
  while (Date.now() < until) {
    last = await fn();
    if (last) return last;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what} (last value ${JSON.stringify(last)})`);
}

// Reads an SSE response body to the end: the data payloads (and event names).
export async function readSse(response) {
  const text = await response.text();
  const events = [];
  for (const block of text.split("\n\n")) {
    let event = null;
    let data = null;
    for (const line of block.split("\n")) {
      if (line.startsWith("event: ")) event = line.slice(7);
      else if (line.startsWith("data: ")) data = line.slice(6);
    }
    if (data !== null) events.push({ event, data });
  }
  return events;
}

// Headless Debian Chromium through playwright-core (KILN_CHROMIUM overrides the path). As
// root in a container it needs --no-sandbox; the network flags keep it from calling out
// (these machines have no network).
export async function launchChromium() {
  const executablePath = process.env.KILN_CHROMIUM || "/usr/bin/chromium";
  if (!fs.existsSync(executablePath))
    throw new Error(`no browser at ${executablePath} (scripts/install-deps installs Debian's chromium)`);
  const { chromium } = requirePeer("playwright-core");
  return chromium.launch({
    executablePath,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--no-first-run"],
  });
}
