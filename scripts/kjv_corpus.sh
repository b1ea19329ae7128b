#!/usr/bin/env bash
# The calibration benchmark's second corpus: the King James Bible (public domain), from Debian's bible-kjv
# package, as plain text with the verse references removed (one verse a line).
#   bash scripts/kjv_corpus.sh OUT.txt        (installs bible-kjv with apt-get if `bible` is missing)
set -euo pipefail
out=${1:?usage: scripts/kjv_corpus.sh OUT.txt}
if ! command -v bible >/dev/null; then
  apt-get update -qq && apt-get install -y -qq bible-kjv >/dev/null
fi
tmp="$out.tmp.$$"
bible -f "Gen1:1-Rev22:21" | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$tmp"
lines=$(wc -l < "$tmp")
if [ "$lines" -lt 30000 ]; then echo "kjv_corpus: only $lines verses written; expected 31102" >&2; rm -f "$tmp"; exit 1; fi
mv "$tmp" "$out"
echo "wrote $out ($lines verses, $(wc -c < "$out") bytes)"
