#!/usr/bin/env python3
"""Checks that every relative link in the repository's Markdown (README.md,
docs/, the crates' READMEs) names a file inside the repository: a clone
must be complete on its own.

usage: scripts/check_links.py   (from the repository root)
"""

import glob
import os
import re
import sys

LINK = re.compile(r"\]\(([^)\s]+)\)")


def main():
    root = os.path.realpath(".")
    docs = ["README.md"] + sorted(glob.glob("docs/**/*.md", recursive=True))
    docs += sorted(glob.glob("*/README.md") + glob.glob("backends/**/README.md", recursive=True))
    bad = []
    for doc in docs:
        with open(doc, encoding="utf-8") as f:
            text = f.read()
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            path = os.path.realpath(os.path.join(os.path.dirname(doc), target.split("#", 1)[0]))
            if os.path.commonpath([root, path]) != root:
                bad.append(f"{doc}: {target} (outside the repository)")
            elif not os.path.exists(path):
                bad.append(f"{doc}: {target} (no such file)")
    if bad:
        sys.exit("links that do not resolve inside the repository:\n  " + "\n  ".join(bad))
    print(f"every relative link in {len(docs)} documents resolves inside the repository")


if __name__ == "__main__":
    main()
