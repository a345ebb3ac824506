// What scripts/soak and scripts/fuzz share (node, standard library only): starting
// `kiln serve` on a free port of 127.0.0.1 and stopping it, /metrics, and the memory of
// the kiln process (resident, and device memory through nvidia-smi).
"use strict";
const { spawn, spawnSync } = require("node:child_process");
const fs = require("node:fs");
const http = require("node:http");

// "--name value" and "--flag" options up to "--"; what follows "--" is `rest`.
function parseArgs(argv, defaults) {
  const opts = { ...defaults, rest: [] };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    if (a === "--") {
      opts.rest = argv.slice(i + 1);
      break;
    }
    if (a === "-h" || a === "--help") {
      opts.help = true;
      continue;
    }
    if (!a.startsWith("--")) throw new Error(`unexpected argument ${a} (kiln serve arguments go after --)`);
    const key = a.slice(2).replace(/-/g, "_");
    if (!(key in defaults)) throw new Error(`unknown option ${a}`);
    if (typeof defaults[key] === "boolean") opts[key] = true;
    else {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      opts[key] = typeof defaults[key] === "number" ? Number(argv[++i]) : argv[++i];
      if (typeof defaults[key] === "number" && !Number.isFinite(opts[key])) throw new Error(`${a}: not a number`);
    }
  }
  return opts;
}

// Starts `kiln serve ARGS --host 127.0.0.1 --port 0` and resolves once it prints its
// "serving MODEL at URL" line. stop(): SIGTERM, then SIGKILL after `timeoutMs`.
function startKiln(binary, args, { readyTimeoutMs = 600000, log = null } = {}) {
  const proc = spawn(binary, ["serve", ...args, "--host", "127.0.0.1", "--port", "0"], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  process.on("exit", () => proc.exitCode === null && proc.kill("SIGKILL"));
  let stdout = "";
  let stderr = "";
  proc.stderr.on("data", (d) => {
    stderr = (stderr + d).slice(-65536);
    if (log) log.write(d);
  });
  const exited = new Promise((resolve) => proc.on("exit", (code, signal) => resolve({ code, signal })));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`kiln was not ready after ${readyTimeoutMs} ms:\n${stderr}`));
    }, readyTimeoutMs);
    proc.stdout.on("data", (d) => {
      stdout += d;
      const m = stdout.match(/serving (\S+) at (http:\/\/[\d.]+:\d+)\/v1/);
      if (!m) return;
      clearTimeout(timer);
      resolve({
        model: m[1],
        url: m[2],
        pid: proc.pid,
        alive: () => proc.exitCode === null && proc.signalCode === null,
        stderr: () => stderr,
        exited,
        async stop(timeoutMs = 60000) {
          if (proc.exitCode !== null || proc.signalCode !== null) return exited;
          proc.kill("SIGTERM");
          const kill = setTimeout(() => proc.kill("SIGKILL"), timeoutMs);
          const r = await exited;
          clearTimeout(kill);
          return r;
        },
      });
    });
    proc.on("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`kiln exited (${code ?? signal}) before it was ready:\n${stderr}`));
    });
    proc.on("error", (e) => {
      clearTimeout(timer);
      reject(new Error(`cannot start ${binary}: ${e.message}`));
    });
  });
}

// One HTTP request; resolves {status, headers, body} or rejects (timeout, reset).
function request(url, { method = "GET", path = "/", body, headers = {}, timeoutMs = 30000 } = {}) {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const payload = body === undefined ? undefined : Buffer.isBuffer(body) ? body : Buffer.from(body);
    const req = http.request({ host: u.hostname, port: u.port, method, path, agent: false,
      headers: { ...(payload ? { "content-type": "application/json", "content-length": payload.length } : {}), ...headers } },
    (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString() }));
      res.on("error", reject);
    });
    req.setTimeout(timeoutMs, () => req.destroy(Object.assign(new Error(`no answer in ${timeoutMs} ms`), { code: "TIMEOUT" })));
    req.on("error", reject);
    req.end(payload);
  });
}

// Prometheus text -> value of the first sample of `name` whose labels contain `labels`.
function metricValue(text, name, labels = "") {
  for (const line of text.split("\n")) {
    if (!line.startsWith(name + "{") || (labels && !line.includes(labels))) continue;
    return Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return undefined;
}

// Every sample of `name` as {labels text: value}.
function metricSamples(text, name) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line.startsWith(name + "{")) continue;
    out[line.slice(name.length + 1, line.lastIndexOf("}"))] = Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return out;
}

async function metrics(url) {
  const r = await request(url, { path: "/metrics", timeoutMs: 30000 });
  if (r.status !== 200) throw new Error(`/metrics answered ${r.status}`);
  return r.body;
}

// Resident memory of a process in bytes (VmRSS), or null once it is gone.
function rssBytes(pid) {
  try {
    const m = fs.readFileSync(`/proc/${pid}/status`, "utf8").match(/^VmRSS:\s+(\d+) kB/m);
    return m ? Number(m[1]) * 1024 : null;
  } catch {
    return null;
  }
}

// Device memory of a process in bytes (nvidia-smi's per-process figure; if the process
// is not listed, as in some containers, the used memory of every GPU), or null without
// nvidia-smi.
function deviceBytes(pid) {
  const q = (args) => spawnSync("nvidia-smi", args, { encoding: "utf8", timeout: 20000 });
  const apps = q(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]);
  if (apps.status !== 0) return null;
  let mib = 0;
  let listed = false;
  for (const line of apps.stdout.split("\n")) {
    const [p, used] = line.split(",").map((s) => s.trim());
    if (Number(p) === pid) {
      mib += Number(used);
      listed = true;
    }
  }
  if (!listed) {
    const gpus = q(["--query-gpu=memory.used", "--format=csv,noheader,nounits"]);
    if (gpus.status !== 0) return null;
    mib = gpus.stdout.split("\n").filter(Boolean).reduce((a, s) => a + Number(s), 0);
  }
  return mib * 1024 * 1024;
}

// A small seeded generator (mulberry32): the same seed, the same run.
function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  next.int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));  // [lo, hi]
  next.pick = (xs) => xs[Math.floor(next() * xs.length)];
  next.chance = (p) => next() < p;
  return next;
}

const MiB = 1024 * 1024;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

module.exports = { parseArgs, startKiln, request, metricValue, metricSamples, metrics, rssBytes, deviceBytes, rng, MiB, sleep };
