#!/usr/bin/env bash
# Downloads the Debian packages the demo corpus comes from (python3.11-doc, fortunes,
# fortunes-min, wordnet-base), unpacks them without installing, and writes the corpus
# (scripts/demo/make_corpus.py) into OUT_DIR.
#   scripts/demo/make_corpus.sh OUT_DIR
set -euo pipefail
out="$1"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download python3.11-doc fortunes fortunes-min wordnet-base > /dev/null 2>&1)
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
python3 "$here/make_corpus.py" "$work/root" "$out"
