#!/usr/bin/env python3
"""scripts/soak.py: scripts/soak (node) in Python 3, standard library only, for machines
without node (the GPU machines). The same options, request mix, checks, report and exit
status; read scripts/soak's header for what each figure means.

  python3 scripts/soak.py --duration 180 --concurrency 8                  # the CPU demo model
  python3 scripts/soak.py --kiln build-gpu/bin/kiln --duration 1200 --concurrency 64 \
    --max-tokens 512 -- configs/Qwen3-30B-A3B.json --load-format dummy --backend cuda
  python3 scripts/soak.py --url http://127.0.0.1:8000 --pid 1234 --duration 600

Exit status 1 when a figure is violated: any error (a 5xx, a 4xx to these valid requests,
no answer within --request-timeout, a malformed answer, a reset the client did not make),
KV blocks or requests left once idle, no answer at the end, resident memory growing by
more than --max-growth-mib from the middle to 95% or the end (device memory: above the
highest level by the middle, warm-up or middle, by more than that), or kiln not
exiting 0 on SIGTERM; 2 when the soak itself cannot run.
"""
import argparse
import atexit
import collections
import contextlib
import errno
import http.client
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULTS = {
    "kiln": os.path.join(HERE, "..", "build", "bin", "kiln"),
    "url": "", "pid": 0,
    "duration": 300,          # seconds of load
    "concurrency": 16,
    "max_tokens": 256,        # output length at most (random below it)
    "max_prompt_words": 300,
    "hangup": 0.1,            # fraction of requests whose client leaves early
    "seed": 1,
    "request_timeout": 300,   # seconds without data from the server
    "max_growth_mib": 64,     # resident memory from the middle, device memory from its level by the middle
    "ready_timeout": 900,     # seconds for kiln to load
    "report": "", "log": "",  # log: kiln's stderr goes here
}
WORDS = ("the a little cat dog bird tree house river sun moon star girl boy friend day night happy sad big small "
         "ran jumped saw found said played looked went came wanted liked red blue green old new good bad and then but so "
         "once upon time garden forest ball book box toy cake rain snow wind park school mother father").split(" ")
STOPS = [".", " the", "\n", " and", "!", "was", " said", ",", "zzz-never"]
SYSTEM = ("You are a helpful assistant who tells short stories for children in plain English words. "
          "Every story has a beginning, a middle and an end, and it is kind.")
OPENAI_ENDS = ("stop", "length")
ANTHROPIC_ENDS = ("end_turn", "max_tokens", "stop_sequence")


def number(s):
    """A number as node's Number() reads it, kept an int where it is one (JSON "0", not "0.0")."""
    v = float(s)
    if not math.isfinite(v):
        raise ValueError(s)
    return int(v) if v.is_integer() else v


def parse_args(argv):
    """The options up to "--"; what follows "--" is `rest` (kiln serve's arguments)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="scripts/soak.py", epilog="[-- kiln serve args]")
    for key, default in DEFAULTS.items():
        p.add_argument("--" + key.replace("_", "-"), dest=key, default=default,
                       type=number if isinstance(default, (int, float)) else str)
    o = vars(p.parse_args(argv[:cut]))
    o["rest"] = argv[cut + 1:]
    return o


def sentence(r, n):
    return " ".join(r.choice(WORDS) for _ in range(n))


def make_request(r, o, model):
    """One random request: {api, path, body, stream, samples, stop_list, hangup_ms}."""
    chance = lambda p: r.random() < p  # noqa: E731
    api = r.choice(["chat", "chat", "completions", "messages", "messages", "count"])
    stream = api != "count" and chance(0.5)
    # Log-uniform lengths: mostly short, some long.
    max_tokens = max(1, round(math.exp(r.random() * math.log(o["max_tokens"]))))
    prompt_words = max(1, round(math.exp(r.random() * math.log(o["max_prompt_words"]))))
    text = sentence(r, prompt_words)
    req = {"api": api, "stream": stream, "samples": 1}
    common = {"model": model, "max_tokens": max_tokens, "seed": r.randint(0, 10**9),
              "temperature": r.choice([0, 0.3, 0.7, 1.0, 1.2])}
    if chance(0.5):
        common["ignore_eos"] = True
    if chance(0.3):
        common["top_p"] = r.choice([0.5, 0.9, 0.95])
    if chance(0.2):
        common["top_k"] = r.choice([1, 20, 50])
    stop_list = [r.choice(STOPS) for _ in range(r.randint(1, 3))] if chance(0.3) else None
    n = r.randint(2, 4) if chance(0.2) else 1
    stop = {"stop": stop_list} if stop_list else {}
    if api == "chat":
        messages = []
        if chance(0.5):
            messages.append({"role": "system", "content": SYSTEM})
        if chance(0.3):
            messages += [{"role": "user", "content": sentence(r, 8)}, {"role": "assistant", "content": sentence(r, 12)}]
        messages.append({"role": "user", "content": text})
        req["path"] = "/v1/chat/completions"
        req["body"] = {**common, "messages": messages, "n": n, **stop, "stream": stream}
        if stream and chance(0.5):
            req["body"]["stream_options"] = {"include_usage": True}
        req["samples"] = n
    elif api == "completions":
        prompts = [text, sentence(r, r.randint(1, 40))] if chance(0.15) else text
        req["path"] = "/v1/completions"
        req["body"] = {**common, "prompt": prompts, "n": n, **stop, "stream": stream}
        req["samples"] = n * (len(prompts) if isinstance(prompts, list) else 1)
    elif api == "messages":
        req["path"] = "/v1/messages"
        req["body"] = {**common, "messages": [{"role": "user", "content": text}], "stream": stream}
        if chance(0.5):
            req["body"]["system"] = SYSTEM
        if stop_list:
            req["body"]["stop_sequences"] = stop_list
    else:
        req["path"] = "/v1/messages/count_tokens"
        req["body"] = {"model": model, "messages": [{"role": "user", "content": text}]}
        if chance(0.5):
            req["body"]["system"] = SYSTEM
    req["stop_list"] = stop_list
    req["hangup_ms"] = r.randint(0, 1500) if api != "count" and chance(o["hangup"]) else -1
    return req


class ReplyError(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_reply(req, status, text):
    """Checks a finished reply; returns the reasons its samples ended or raises ReplyError."""
    if status != 200:
        raise ReplyError(f"http_{status}", f"status {status}: {text[:200]}")

    def need(ok, why):
        if not ok:
            raise ReplyError("malformed_reply", f"{why}: {text[:300]}")

    def parse(s, what):
        try:
            return json.loads(s)
        except ValueError:
            need(False, what)

    if not req["stream"]:
        j = parse(text, "not JSON")
        if req["api"] == "count":
            need(is_num(j.get("input_tokens")) and j["input_tokens"] > 0, "no input_tokens")
            return ["counted"]
        if req["api"] == "messages":
            need(j.get("type") == "message" and isinstance(j.get("content"), list), "not a message")
            need(j.get("stop_reason") in ANTHROPIC_ENDS, f"stop_reason {j.get('stop_reason')}")
            return [j["stop_reason"]]
        choices = j.get("choices")
        need(isinstance(choices, list) and len(choices) == req["samples"],
             f"{len(choices) if isinstance(choices, list) else None} choices")
        for c in choices:
            need(c.get("finish_reason") in OPENAI_ENDS, f"finish_reason {c.get('finish_reason')}")
            out = ((c.get("message") or {}).get("content") or "") if req["api"] == "chat" else c.get("text")
            need(isinstance(out, str), "no text")
            for s in req["stop_list"] or [] if c["finish_reason"] == "stop" else []:
                need(s not in out, f"the text goes on past stop string {json.dumps(s)}")
        usage = j.get("usage") or {}
        need(is_num(usage.get("completion_tokens")) and usage["completion_tokens"] >= 0, "no usage")
        return [c["finish_reason"] for c in choices]
    # SSE: every event parses; the stream closes properly; each choice ends once.
    events = []
    for block in text.split("\n\n"):
        event = data = None
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if data is not None:
            events.append((event, data))
    if req["api"] == "messages":
        need(events and events[-1][0] == "message_stop", "no message_stop")
        reason = None
        for _, data in events:
            j = parse(data, "an event is not JSON")
            if j.get("type") == "error":
                raise ReplyError("error_event", f"error event: {data}")
            if j.get("type") == "message_delta":
                reason = (j.get("delta") or {}).get("stop_reason")
        need(reason in ANTHROPIC_ENDS, f"stop_reason {reason}")
        return [reason]
    need(events and events[-1][1] == "[DONE]", "no [DONE]")
    finish = {}
    for _, data in events[:-1]:
        j = parse(data, "a chunk is not JSON")
        if j.get("error"):
            raise ReplyError("error_event", f"error chunk: {data}")
        for c in j.get("choices") or []:
            if c.get("finish_reason"):
                finish[c.get("index")] = c["finish_reason"]
    need(len(finish) == req["samples"], f"{len(finish)} of {req['samples']} choices ended")
    for f in finish.values():
        need(f in OPENAI_ENDS, f"finish_reason {f}")
    return list(finish.values())


def send(url, req, timeout_s):
    """Sends `req`: ("served", ends) | ("hung_up",) | ("error", kind, message). A client that
    hangs up shuts its socket from a timer thread at hangup_ms, wherever the exchange is."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)  # an idle timeout, as node's
    lock, state = threading.Lock(), {"done": False, "hung": False}

    def hang_up():
        with lock, contextlib.suppress(OSError):
            if not state["done"]:
                state["hung"] = True
                if conn.sock is not None:  # else send() sees "hung" once connected
                    conn.sock.shutdown(socket.SHUT_RDWR)

    def finish():  # -> whether the client hung up first
        with lock:
            state["done"] = True
            return state["hung"]
    timer = threading.Timer(req["hangup_ms"] / 1000, hang_up) if req["hangup_ms"] >= 0 else None
    if timer:
        timer.daemon = True
        timer.start()
    phase, text = "connection", ""
    try:
        conn.connect()
        if state["hung"]:
            return ("hung_up",)
        conn.request("POST", req["path"], body=json.dumps(req["body"]).encode(),
                     headers={"content-type": "application/json", "connection": "close"})
        resp = conn.getresponse()
        phase = "reset"
        text = resp.read().decode("utf-8", "replace")
        if finish():
            return ("hung_up",)
        return ("served", check_reply(req, resp.status, text))
    except ReplyError as e:
        return ("error", e.kind, str(e))
    except (OSError, http.client.HTTPException) as e:
        if finish():
            return ("hung_up",)
        if isinstance(e, socket.timeout):
            return ("error", "timeout", f"no complete answer in {timeout_s} s on {req['path']}")
        code = errno.errorcode.get(e.errno, "error") if getattr(e, "errno", None) else type(e).__name__
        return ("error", f"{phase}_{code}", f"{type(e).__name__}: {e}")
    except Exception as e:  # a reply of the wrong shape (say a list where an object goes)
        return ("error", "malformed_reply", f"{type(e).__name__} {e}: {text[:300]}")
    finally:
        finish()
        if timer:
            timer.cancel()
        conn.close()


def get(url, path, timeout_s=30):
    """GET `path`: (status, body text); raises on no answer."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def metric_value(text, name):
    """Prometheus text -> value of the first sample of `name` (with labels), or None."""
    for line in text.split("\n"):
        if line.startswith(name + "{"):
            return number(line[line.rindex(" ") + 1:])
    return None


def metric_samples(text, name):
    """Every sample of `name` as {labels text: value}."""
    return {line[len(name) + 1:line.rindex("}")]: number(line[line.rindex(" ") + 1:])
            for line in text.split("\n") if line.startswith(name + "{")}


def rss_mib(pid):
    """Resident memory of a process (VmRSS) in MiB, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            m = re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M)
        return number(round(int(m.group(1)) / 1024, 1)) if m else None
    except OSError:
        return None


def device_mib(pid):
    """nvidia-smi's device memory of the process (if it is not listed, as in some
    containers, the used memory of every GPU it may use), or None without nvidia-smi."""
    def q(args):
        try:
            p = subprocess.run(["nvidia-smi"] + args, capture_output=True, text=True, timeout=20)
            return p.stdout if p.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None
    apps = q(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    if apps is None:
        return None
    rows = [[s.strip() for s in line.split(",")] for line in apps.split("\n") if "," in line]
    mine = [float(used) for p, used in rows if p == str(pid)]
    if not mine:
        # Only the GPUs kiln sees (CUDA_VISIBLE_DEVICES as indices): others may be busy.
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        only = ["-i", visible] if re.fullmatch(r"\d+(,\d+)*", visible) else []
        gpus = q(["--query-gpu=memory.used", "--format=csv,noheader,nounits"] + only)
        if gpus is None:
            return None
        mine = [float(s) for s in gpus.split("\n") if s.strip()]
    return number(round(sum(mine), 1))


class Kiln:
    """`kiln serve ARGS --host 127.0.0.1 --port 0`, ready once it prints "serving MODEL at URL";
    stop(): SIGTERM, then SIGKILL after `timeout_s`."""

    def __init__(self, binary, args, ready_timeout_s, log_path):
        self.proc = subprocess.Popen([binary, "serve", *args, "--host", "127.0.0.1", "--port", "0"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        atexit.register(lambda: self.proc.poll() is None and self.proc.kill())
        self.pid, self.url, self.stderr = self.proc.pid, None, b""
        ready = threading.Event()
        log = open(log_path, "wb") if log_path else None

        def read_stdout():
            seen = ""
            for line in self.proc.stdout:  # drained to the end so kiln never blocks on it
                if self.url is None:
                    seen += line.decode("utf-8", "replace")
                    m = re.search(r"serving (\S+) at (http://[\d.]+:\d+)/v1", seen)
                    if m:
                        self.url = m.group(2)
                        ready.set()
            ready.set()  # kiln exited

        def read_stderr():
            for chunk in iter(lambda: self.proc.stderr.read1(65536), b""):
                self.stderr = (self.stderr + chunk)[-65536:]
                if log:
                    log.write(chunk)
                    log.flush()
        threading.Thread(target=read_stdout, daemon=True).start()
        threading.Thread(target=read_stderr, daemon=True).start()
        tail = lambda: self.stderr.decode("utf-8", "replace")  # noqa: E731
        if not ready.wait(ready_timeout_s):
            self.proc.kill()
            raise RuntimeError(f"kiln was not ready after {ready_timeout_s} s:\n{tail()}")
        if self.url is None:
            self.proc.wait()
            raise RuntimeError(f"kiln exited ({self.proc.returncode}) before it was ready:\n{tail()}")

    def stop(self, timeout_s=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode
        return {"code": rc, "signal": None} if rc >= 0 else {"code": None, "signal": signal.Signals(-rc).name}


def wait_idle(url, timeout_s=60):
    """Once the load stops: every request ends (hang-ups included) and every KV block returns."""
    until = time.time() + timeout_s
    while True:
        try:
            status, text = get(url, "/metrics")
            text = text if status == 200 else ""
        except (OSError, http.client.HTTPException):
            text = ""
        idle = {"kv_blocks_used": metric_value(text, "kiln_kv_cache_blocks_used"),
                "requests_in_flight": metric_value(text, "kiln_num_requests_in_flight"),
                "requests_running": metric_value(text, "kiln_num_requests_running"),
                "http_statuses": metric_samples(text, "kiln_http_requests_total")}
        if idle["kv_blocks_used"] == idle["requests_in_flight"] == idle["requests_running"] == 0 or time.time() > until:
            return idle
        time.sleep(0.2)


def main(argv):
    o = parse_args(argv)
    rest = o["rest"]
    cuda = any(a == "--backend=cuda" or (a == "--backend" and rest[i + 1:i + 2] == ["cuda"]) for i, a in enumerate(rest))
    say = lambda s: print(f"soak: {s}", file=sys.stderr, flush=True)  # noqa: E731
    server, url, pid = None, o["url"], o["pid"]
    if not url:
        say(f"starting {o['kiln']} serve {' '.join(rest)}")
        server = Kiln(o["kiln"], rest, o["ready_timeout"], o["log"])
        url, pid = server.url, server.pid
    models = json.loads(get(url, "/v1/models")[1])["data"]
    model = models[0]["id"]
    max_model_len = models[0].get("max_model_len") or 2048
    # Prompt (about 1.5 tokens a word, plus the template) and output fit the context.
    o["max_prompt_words"] = max(1, min(o["max_prompt_words"], max_model_len // 6))
    o["max_tokens"] = max(1, min(o["max_tokens"], max_model_len // 2))
    say(f"{model} at {url} (pid {pid}, max model len {max_model_len}), {o['concurrency']} clients for "
        f"{o['duration']} s, outputs up to {o['max_tokens']} tokens, {o['hangup'] * 100:g}% hang-ups")

    t0 = time.time()
    memory = []

    def sample(label):
        m = {"label": label, "t_s": round(time.time() - t0), "rss_mib": rss_mib(pid)}
        if cuda:
            m["device_mib"] = device_mib(pid)
        memory.append(m)
        return m
    sample("start")
    until = t0 + o["duration"]
    lock = threading.Lock()
    counts = {"requests": 0, "served": 0, "hung_up": 0, "errors": 0}
    by_api, ends, errors = collections.Counter(), collections.Counter(), collections.Counter()
    examples = {}
    r = random.Random(o["seed"])
    r_lock = threading.Lock()  # one generator for every client

    def client():
        while time.time() < until:
            with r_lock:
                req = make_request(r, o, model)
            with lock:
                by_api[req["api"] + (" stream" if req["stream"] else "")] += 1
                counts["requests"] += 1
            res = send(url, req, o["request_timeout"])
            with lock:
                counts[res[0] if res[0] != "error" else "errors"] += 1
                if res[0] == "served":
                    ends.update(res[1])
                elif res[0] == "error":
                    errors[res[1]] += 1
                    body = json.dumps(req["body"], separators=(",", ":"))[:300]
                    examples.setdefault(res[1], f"{req['path']} {body} -> {res[2]}")

    # Under load: after warm-up, in the middle, near the end; "end" is once idle.
    marks = [(0.1, "warm"), (0.5, "middle"), (0.95, "late")]
    stop_ticker = threading.Event()

    def ticker():
        while not stop_ticker.wait(min(30, max(1, o["duration"] * 0.1))):
            while marks and (time.time() - t0) / o["duration"] >= marks[0][0]:
                sample(marks.pop(0)[1])
            with lock:
                c = dict(counts)
            say(f"{round(time.time() - t0)} s: {c['requests']} requests, {c['served']} served, {c['hung_up']} hung up, "
                f"{c['errors']} errors, kiln resident {rss_mib(pid)} MiB")
    tick = threading.Thread(target=ticker, daemon=True)
    tick.start()
    clients = [threading.Thread(target=client, daemon=True) for _ in range(int(o["concurrency"]))]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    stop_ticker.set()
    tick.join()
    for _, label in marks:  # a very short run
        sample(label)

    idle = wait_idle(url)
    sample("end")
    try:
        health = get(url, "/health")[0]
    except (OSError, http.client.HTTPException) as e:
        health = str(e)
    probe = send(url, {"api": "chat", "path": "/v1/chat/completions", "stream": False, "samples": 1, "stop_list": None,
                       "hangup_ms": -1, "body": {"model": model, "max_tokens": 8,
                                                 "messages": [{"role": "user", "content": "Are you still there?"}]}}, 60)
    answers = health == 200 and probe[0] == "served"
    exit_ = server.stop() if server else None

    server_5xx = sum(v for k, v in idle["http_statuses"].items() if 'status="5' in k)
    checks = [
        (counts["served"] == 0, "no request was served"),
        (counts["errors"] > 0, f"{counts['errors']} errors: {json.dumps(errors)}"),
        (server_5xx > 0, f"kiln counted {server_5xx} responses with a 5xx status"),
        (idle["kv_blocks_used"] != 0, f"{idle['kv_blocks_used']} KV blocks in use once idle"),
        (idle["requests_in_flight"] != 0 or idle["requests_running"] != 0,
         f"requests left once idle: {idle['requests_in_flight']} in flight, {idle['requests_running']} running"),
        (not answers, f"the server does not answer at the end (health {health}, {' '.join(map(str, probe[::2]))})"),
        (exit_ is not None and exit_["code"] != 0,
         f"kiln exited with {exit_ and (exit_['code'] if exit_['code'] is not None else exit_['signal'])} on SIGTERM"),
    ]
    # Resident memory: the middle sample against the later ones. Device memory: against the
    # highest level by the middle (warm-up or middle): it is a fixed KV cache plus the
    # caching allocator's free blocks, which rise and fall by GBs with the batch mix (a 20-
    # minute GPU run sampled 142.6 / 140.5 / 139.5 / 142.6 GB at warm / middle / late / end),
    # so a leak is a level above any seen before, not a sample above a low middle one.
    earlier = {key: [m[key] for m in memory if m["label"] in (("middle",) if key == "rss_mib" else ("warm", "middle"))
                     and m.get(key) is not None] for key in ("rss_mib", "device_mib")}
    for key in ("rss_mib", "device_mib"):
        later = [m[key] for m in memory if m["label"] in ("late", "end") and m.get(key) is not None]
        if earlier[key] and later:
            growth = max(later) - max(earlier[key])
            since = "the middle" if key == "rss_mib" else "the highest level by the middle"
            checks.append((growth > o["max_growth_mib"],
                           f"{key} grew {growth:.1f} MiB from {since} to the end (at most {o['max_growth_mib']})"))
    violations = [why for violated, why in checks if violated]

    report = {
        "model": model, "url": url, "duration_s": o["duration"], "concurrency": o["concurrency"], "seed": o["seed"],
        "max_tokens": o["max_tokens"], "hangup_fraction": o["hangup"], "kiln_args": rest,
        "backend": "cuda" if cuda else "cpu", **counts,
        "requests_per_s": round(counts["requests"] / (time.time() - t0), 2),
        "by_api": by_api, "ends": ends, "errors_by_kind": errors, "error_examples": examples,
        "memory": memory, "idle": idle, "still_answers": answers, "server_5xx": server_5xx, "kiln_exit": exit_,
        "violations": violations,
    }
    text = json.dumps(report, indent=2)
    if o["report"]:
        with open(o["report"], "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    c = counts
    say(f"{c['requests']} requests in {o['duration']} s: {c['served']} served (ends {json.dumps(ends)}), "
        f"{c['hung_up']} hung up, {c['errors']} errors {json.dumps(errors)}")
    say("kiln resident MiB " + ", ".join(f"{m['label']} {m['rss_mib']}" for m in memory) +
        ("; device MiB " + ", ".join(f"{m['label']} {m['device_mib']}" for m in memory) if cuda else ""))
    say(f"once idle {idle['kv_blocks_used']} KV blocks used, {idle['requests_in_flight']} requests in flight; "
        f"still answers: {str(answers).lower()}")
    for v in violations:
        say(f"VIOLATED: {v}")
    say("FAILED" if violations else "passed")
    return 1 if violations else 0


if __name__ == "__main__":
    # SIGTERM to the soak ends it like ^C: atexit stops a kiln it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as e:  # noqa: BLE001 (the soak could not run: report why, exit 2)
        print(f"soak: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
