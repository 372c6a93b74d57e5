#!/usr/bin/env python3
"""Doxygen input filter for tessel's headers (docs/Doxyfile): tessel writes
its comments as plain // lines above what they describe; this makes them
doc comments for Doxygen, which reads /// only. A header's opening comment
(before its first line of code) becomes the file's description (\\file);
a comment on its own line(s) becomes the description of what follows;
a comment after code on the same line stays a plain comment. Angle
brackets and backslashes in comments are escaped (they are placeholders
such as <output_dir> and paths, not markup)."""
import re
import sys


def escape(text):
    return re.sub(r"([<>\\\\@&#%$])", r"\\\1", text)


def main(path):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    out = []
    opening = True  # still in the header's opening comment
    for line in lines:
        m = re.match(r"^(\s*)//(?!/)(.*)$", line)
        if m:
            body = escape(m.group(2))
            if opening and not out:
                out.append(f"{m.group(1)}/// \\file")
            out.append(f"{m.group(1)}///{body}")
            continue
        if opening and out and line.strip() == "":
            out.append("")  # the opening comment ends at the first blank line
            opening = False
            continue
        opening = False if line.strip() else opening
        out.append(line)
    sys.stdout.write("\n".join(out))


main(sys.argv[1])
