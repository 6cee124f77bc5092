#!/bin/sh
# Rebuilds fortunes.txt.gz from Debian's `fortunes-min` and `fortunes` packages
# (fortune-mod 1.99.1, Debian revision 7.3).
# Needs apt-get (any Debian or Ubuntu; no root needed for `apt-get download`), dpkg-deb,
# python3 and gzip. Run from this directory: sh extract.sh
set -eu
FILES="literature songs-poems wisdom love people humorists platitudes work men-women fortunes kids food education pets art"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download fortunes-min=1:1.99.1-7.3 fortunes=1:1.99.1-7.3 &&
    for deb in ./*.deb; do dpkg-deb -x "$deb" x; done)
dir="$tmp/x/usr/share/games/fortunes"
# Each fortune ends with a line holding only `%`; keep them in file order, one blank line
# between fortunes. Tabs become spaces and anything outside printable ASCII is dropped,
# so the text has at most 96 distinct characters (newline and 32..126).
for f in $FILES; do cat "$dir/$f"; done | python3 -c '
import sys
text = sys.stdin.buffer.read().decode("latin-1").replace("\t", "    ")
fortunes = [f.strip("\n") for f in text.split("\n%\n")]
out = "\n\n".join(f for f in fortunes if f.strip()) + "\n"
out = "".join(c for c in out if c == "\n" or " " <= c <= "~")
sys.stdout.write(out)
' > fortunes.txt
gzip -9 -n -f fortunes.txt
ls -l fortunes.txt.gz
