#!/usr/bin/env python3
"""The demo model's training corpus, from English text Debian ships (Python's standard
library only; run here, then carried to the GPU machine, which has no network).

    scripts/demo/make_corpus.sh OUT_DIR     # downloads the packages, then runs this:
    scripts/demo/make_corpus.py ROOT OUT_DIR

ROOT is a directory where these packages are unpacked (dpkg-deb -x):
  python3.11-doc  /usr/share/doc/python3.11/html/**/*.html  the Python 3.11 documentation
  fortunes        /usr/share/games/fortunes/*                 fortune cookies (the inoffensive set)
  fortunes-min    /usr/share/games/fortunes/fortunes
  wordnet-base    /usr/share/wordnet/data.{noun,verb,adj,adv} WordNet 3.0 glosses

Cleaning: HTML pages keep the text of the documentation body (navigation, sidebars,
scripts, the pilcrow links and the "Source code:" lines go); whitespace is collapsed per
paragraph, code blocks keep their lines; fortunes are split at their "%" lines, and ones
with control characters or longer than 1,500 characters are dropped; WordNet synsets
become "word (noun): gloss" lines, 40 synsets a document.

Replies: a short instruction-style portion renders as chats (user, assistant), so the
model learns that a turn gets an answer: "What does X mean?" -> the WordNet gloss, "Tell
me a short story / a joke / something wise" -> a fortune, "What is the X module for?" ->
the first paragraph of that module's page.

Output: OUT/train.jsonl.gz and OUT/heldout.jsonl.gz (one in 100 documents, by a hash of
its text), each line {"text": ...} or {"messages": [{"role", "content"}, ...]}, and
OUT/stats.json.
"""
import gzip
import hashlib
import html.parser
import json
import os
import random
import re
import sys

SKIP_TAGS = {"script", "style", "nav", "head", "footer"}
SKIP_CLASSES = {"sphinxsidebar", "related", "footer", "headerlink", "navigation", "sphinxsidebarwrapper"}
BLOCK_TAGS = {"p", "pre", "h1", "h2", "h3", "h4", "li", "dt", "dd", "div", "section", "tr", "br", "table"}


class DocText(html.parser.HTMLParser):
    """The body text of a Sphinx page: paragraphs, with code blocks kept line by line."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack = []  # per open tag: does it hide its content?
        self.in_body = 0
        self.in_pre = 0
        self.parts = []
        self.title = ""
        self.in_h1 = False

    def hidden(self):
        return any(self.stack)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        hide = tag in SKIP_TAGS or bool(classes & SKIP_CLASSES)
        if tag in ("br", "img", "hr", "meta", "link", "input"):
            if tag == "br":
                self.parts.append("\n")
            return
        self.stack.append(hide)
        if tag == "div" and "body" in classes:
            self.in_body += 1
        if tag == "pre":
            self.in_pre += 1
            self.parts.append("\n\n")
        elif tag in BLOCK_TAGS:
            self.parts.append("\n\n")
        if tag == "h1":
            self.in_h1 = True

    def handle_endtag(self, tag):
        if tag in ("br", "img", "hr", "meta", "link", "input"):
            return
        if self.stack:
            self.stack.pop()
        if tag == "pre":
            self.in_pre = max(0, self.in_pre - 1)
            self.parts.append("\n\n")
        elif tag in BLOCK_TAGS:
            self.parts.append("\n\n")
        if tag == "h1":
            self.in_h1 = False

    def handle_data(self, data):
        if self.hidden():
            return
        if self.in_h1:
            self.title += data
        if self.in_pre:
            self.parts.append(data)
        else:
            self.parts.append(re.sub(r"\s+", " ", data))

    def text(self):
        raw = "".join(self.parts).replace("\u00b6", "")
        paras = []
        for p in re.split(r"\n\s*\n", raw):
            p = p.strip("\n")
            if not p.strip():
                continue
            if "\n" not in p:
                p = p.strip()
            if p.startswith("Source code:") or p in ("Navigation", "Table of Contents", "Previous topic", "Next topic"):
                continue
            paras.append(p)
        return "\n\n".join(paras)


def clean(s):
    s = s.replace("\r", "")
    s = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", s)
    return s.strip()


def python_docs(root):
    base = os.path.join(root, "usr/share/doc/python3.11/html")
    docs, chats = [], []
    for dirpath, _, files in sorted(os.walk(base)):
        if "/_static" in dirpath or "/_sources" in dirpath:
            continue
        for f in sorted(files):
            if not f.endswith(".html") or f in ("genindex.html", "search.html", "py-modindex.html") or f.startswith("genindex"):
                continue
            with open(os.path.join(dirpath, f), encoding="utf-8", errors="replace") as fh:
                p = DocText()
                p.feed(fh.read())
            text = clean(p.text())
            if len(text) < 400:
                continue
            docs.append(text)
            title = re.sub(r"\s+", " ", p.title).strip()
            m = re.match(r"^([\w.]+) — (.+)$", title)
            paras = [x for x in text.split("\n\n") if len(x) > 80 and "\n" not in x]
            if m and paras:
                answer = paras[0][:700]
                chats.append([f"What is the {m.group(1)} module for?", f"The {m.group(1)} module: {m.group(2)}. {answer}"])
            elif title and paras:
                chats.append([f"Explain {title.rstrip('.')}.", paras[0][:700]])
    return docs, chats


def fortunes(root):
    base = os.path.join(root, "usr/share/games/fortunes")
    out = []
    for f in sorted(os.listdir(base)):
        path = os.path.join(base, f)
        if "." in f or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as fh:
            for item in fh.read().split("\n%\n"):
                item = item.strip("%\n ")
                if 20 <= len(item) <= 1500 and not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", item):
                    out.append(item)
    return out


def wordnet(root):
    base = os.path.join(root, "usr/share/wordnet")
    pos_names = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}
    entries = []
    for pos in ("noun", "verb", "adj", "adv"):
        with open(os.path.join(base, "data." + pos), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("  ") or "|" not in line:
                    continue  # the licence header
                head, gloss = line.split("|", 1)
                fields = head.split()
                n_words = int(fields[3], 16)
                words = [fields[4 + 2 * i].replace("_", " ") for i in range(n_words)]
                words = [re.sub(r"\(\w+\)$", "", w) for w in words]
                entries.append((words, pos_names[pos], gloss.strip()))
    return entries


def wordnet_docs_and_chats(entries, rng):
    docs, chats = [], []
    lines = []
    for words, pos, gloss in entries:
        lines.append(f"{', '.join(words)} ({pos}): {gloss}")
        if len(lines) == 40:
            docs.append("\n".join(lines))
            lines = []
    if lines:
        docs.append("\n".join(lines))
    questions = ["What does \"{w}\" mean?", "Define {w}.", "What is the meaning of the word {w}?", "Explain the word {w}."]
    for words, pos, gloss in entries:
        if rng.random() > 0.35:
            continue
        w = words[0]
        definition, _, examples = gloss.partition("; \"")
        answer = f"\"{w}\" is a {pos}: {definition.strip().rstrip(';')}."
        if examples:
            answer += f" For example: \"{examples.strip()}"
            if not answer.endswith('"'):
                answer += '"'
        chats.append([rng.choice(questions).format(w=w), answer])
    return docs, chats


def fortune_chats(items, rng):
    chats = []
    for item in items:
        sentences = len(re.findall(r"[.!?](\s|$)", item))
        if sentences >= 3 and len(item) > 200:
            q = rng.choice(["Tell me a short story.", "Write me a short story.", "Tell me a story, please."])
        elif "--" in item:
            q = rng.choice(["Say something wise.", "Give me a quotation.", "Tell me something to think about."])
        else:
            q = rng.choice(["Tell me a joke.", "Say something funny.", "Tell me something interesting."])
        chats.append([q, item])
    return chats


def held_out(text):
    return hashlib.sha1(text.encode("utf-8")).digest()[0] < 3  # about 1 in 85


def main():
    root, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(20261123)
    py_docs, py_chats = python_docs(root)
    forts = fortunes(root)
    wn_docs, wn_chats = wordnet_docs_and_chats(wordnet(root), rng)
    records = [{"text": t} for t in py_docs + wn_docs]
    records += [{"text": f} for f in forts]
    for q, a in py_chats + wn_chats + fortune_chats(forts, rng):
        records.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
    rng.shuffle(records)
    stats = {"python_doc_pages": len(py_docs), "wordnet_documents": len(wn_docs), "fortunes": len(forts),
             "chats": len(py_chats) + len(wn_chats) + len(forts), "train_bytes": 0, "heldout_bytes": 0}
    with gzip.open(os.path.join(out, "train.jsonl.gz"), "wt", encoding="utf-8") as tr, \
            gzip.open(os.path.join(out, "heldout.jsonl.gz"), "wt", encoding="utf-8") as ho:
        for r in records:
            body = r.get("text") or json.dumps(r["messages"])
            key = "heldout_bytes" if held_out(body) else "train_bytes"
            stats[key] += len(body.encode("utf-8"))
            (ho if key == "heldout_bytes" else tr).write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(os.path.join(out, "stats.json"), "w") as f:
        json.dump(stats, f, indent=2)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
