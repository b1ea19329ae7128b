#!/usr/bin/env bash
# The verdict validation's corpora (plelab validate): natural text never used in plelab's development, from two
# Debian packages of different kinds of writing.
#   bash scripts/validation_corpora.sh OUTDIR
#     OUTDIR/linux-doc.txt  the Linux kernel's documentation (linux-doc-6.1: reST prose and plain-text notes)
#     OUTDIR/fortunes.txt   the fortune cookie files (fortunes: quotations, literature, jokes), one entry a paragraph
# Installs the two packages with apt-get if they are missing. Files are read in byte order, so the same package
# versions give the same bytes; the validation's plan records the sha256 of the text as plelab reads it.
set -euo pipefail
out=${1:?usage: scripts/validation_corpora.sh OUTDIR}
docs=/usr/share/doc/linux-doc-6.1/Documentation
fortunes=/usr/share/games/fortunes
if [ ! -d "$docs" ] || [ ! -d "$fortunes" ]; then
  apt-get update -qq && apt-get install -y -qq linux-doc-6.1 fortunes >/dev/null
fi
mkdir -p "$out"
tmp="$out/.linux-doc.txt.$$"
find "$docs" -type f \( -name '*.rst.gz' -o -name '*.txt.gz' \) -print0 | LC_ALL=C sort -z | xargs -0 zcat > "$tmp"
mv "$tmp" "$out/linux-doc.txt"
tmp="$out/.fortunes.txt.$$"
find "$fortunes" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 | LC_ALL=C sort -z \
  | xargs -0 cat | sed 's/^%$//' > "$tmp"
mv "$tmp" "$out/fortunes.txt"
for f in linux-doc fortunes; do
  echo "wrote $out/$f.txt ($(wc -c < "$out/$f.txt") bytes)"
done
