#!/usr/bin/env python3
"""Checks the links of the repository's Markdown: README.md, the book
(docs/: book.toml's sources under docs/src/, and docs/design.md, which the
book includes), and the crates' READMEs.

- A relative link names a file inside the repository: a clone must be
  complete on its own. A chapter of the book (docs/src/) links only inside
  docs/src/, since the built book holds nothing else; it names a
  repository file as code (`cli/tests/service.rs`) or includes it with
  mdBook's {{#include}}.
- A link's #anchor names a heading of the page it points to (or of its
  own page), by the slug GitHub and mdBook give a heading: lower case,
  letters, digits, `_` and `-` kept, each space a `-`, the rest dropped,
  and `-1`, `-2`, ... after repeats. Headings in fenced code are not
  headings; a chapter's {{#include FILE}} counts as FILE's text.
- The book's SUMMARY.md lists every chapter, and every chapter it lists
  exists.

With --html DIR it checks a built book instead: every relative href in
DIR's pages names a file in DIR, and its #fragment an id of that page
(mdBook's own slugs, so the sources and the output are checked alike).

usage: scripts/check_links.py [--html DIR]   (from the repository root)
"""

import glob
import html.parser
import os
import re
import sys

LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INCLUDE = re.compile(r"\{\{#include\s+([^}\s:]+)(?::[^}]*)?\s*\}\}")
URL = re.compile(r"[a-z][a-z0-9+.-]*:")
BOOK_SRC = os.path.join("docs", "src")


def prose(text):
    """The lines outside fenced code blocks."""
    fenced = False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield line


def expand(path, text, depth=0):
    """The text with mdBook's {{#include FILE}} replaced by FILE's text."""

    def one(m):
        inc = os.path.join(os.path.dirname(path), m.group(1))
        if depth > 8 or not os.path.isfile(inc):
            return m.group(0)
        with open(inc, encoding="utf-8") as f:
            return expand(inc, f.read(), depth + 1)

    return INCLUDE.sub(one, text)


def slug(heading):
    # Inline markup goes first: code spans keep their text, links their
    # label, emphasis and HTML tags nothing.
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    out = []
    for ch in text.lower():
        if ch.isalnum() or ch in "_-":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def anchors(path, cache={}):
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            text = expand(path, f.read())
        seen, found = {}, set()
        for line in prose(text):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def check_sources():
    root = os.path.realpath(".")
    book = os.path.realpath(BOOK_SRC)
    docs = ["README.md"] + sorted(glob.glob("docs/**/*.md", recursive=True))
    docs += sorted(glob.glob("*/README.md") + glob.glob("backends/**/README.md", recursive=True))
    bad = []
    for doc in docs:
        with open(doc, encoding="utf-8") as f:
            text = f.read()
        in_book = os.path.commonpath([book, os.path.realpath(doc)]) == book
        for target in LINK.findall("\n".join(prose(text))):
            if URL.match(target):
                continue
            file, _, frag = target.partition("#")
            path = os.path.realpath(os.path.join(os.path.dirname(doc), file)) if file else os.path.realpath(doc)
            if os.path.commonpath([root, path]) != root:
                bad.append(f"{doc}: {target} (outside the repository)")
            elif not os.path.exists(path):
                bad.append(f"{doc}: {target} (no such file)")
            elif in_book and os.path.commonpath([book, path]) != book:
                bad.append(f"{doc}: {target} (outside the book's docs/src/: name the file as code instead)")
            elif frag and path.endswith(".md") and frag not in anchors(path):
                bad.append(f"{doc}: {target} (no heading #{frag} in {os.path.relpath(path)})")
    bad += check_summary()
    if bad:
        sys.exit("links that do not resolve:\n  " + "\n  ".join(bad))
    print(f"every relative link and anchor in {len(docs)} documents resolves inside the repository")


def check_summary():
    summary = os.path.join(BOOK_SRC, "SUMMARY.md")
    if not os.path.exists(summary):
        return [f"{summary}: missing"]
    with open(summary, encoding="utf-8") as f:
        listed = {os.path.normpath(os.path.join(BOOK_SRC, t.partition("#")[0])) for t in LINK.findall(f.read())}
    chapters = {os.path.normpath(p) for p in glob.glob(os.path.join(BOOK_SRC, "**", "*.md"), recursive=True)}
    chapters.discard(os.path.normpath(summary))
    bad = [f"{summary}: lists {p}, which does not exist" for p in sorted(listed - chapters)]
    bad += [f"{p}: not listed in {summary}" for p in sorted(chapters - listed)]
    return bad


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.hrefs = set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.hrefs.append(attrs["href"])


def check_html(out):
    pages = {}
    for path in glob.glob(os.path.join(out, "**", "*.html"), recursive=True):
        page = Page()
        with open(path, encoding="utf-8") as f:
            page.feed(f.read())
        pages[os.path.realpath(path)] = page
    bad, checked = [], 0
    for path, page in sorted(pages.items()):
        if os.path.basename(path) in ("print.html", "404.html", "toc.html"):
            continue  # mdBook's own pages: the chapters' links again, and absolute ones
        for href in page.hrefs:
            if URL.match(href) or href.startswith("/"):
                continue
            file, _, frag = href.partition("#")
            target = os.path.realpath(os.path.join(os.path.dirname(path), file)) if file else path
            checked += 1
            rel = os.path.relpath(path, out)
            if not os.path.exists(target):
                bad.append(f"{rel}: {href} (no such file in the built book)")
            elif frag and target in pages and frag not in pages[target].ids:
                bad.append(f"{rel}: {href} (no id {frag!r})")
    if not pages:
        bad.append(f"{out}: no pages")
    if bad:
        sys.exit("links that do not resolve in the built book:\n  " + "\n  ".join(bad))
    print(f"every relative link in the built book resolves ({checked} in {len(pages)} pages)")


def main():
    args = sys.argv[1:]
    if args[:1] == ["--html"] and len(args) == 2:
        check_html(args[1])
    elif not args:
        check_sources()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
