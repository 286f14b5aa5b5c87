#!/usr/bin/env python3
"""Turn extracted Debian packages into a clean English training corpus.

Called by tools/prepare_corpus.sh (python3 standard library only).

Input : --src DIR with one sub-folder per package (dpkg -x output) and
        DIR/kjv.txt (the King James text dumped by the `bible` program).
Output: OUT/train.txt, OUT/heldout.txt  documents separated by a line holding
        only DOC_SEP ("<|endoftext|>", the tokenizer's eos), and
        OUT/manifest.json (package, version, license, bytes, documents).
        Optionally --eval-dir: heldout_N.txt files and haystack.txt taken
        from the held-out split only.

The train/held-out split is BY DOCUMENT (a document is a file of the docs, a
book of the Bible, or a ~16 KB run of whole dictionary entries) and is
deterministic: sha256(package + "/" + document id) decides.
"""
import argparse
import gzip
import hashlib
import html
import html.parser
import json
import os
import re
import sys
import unicodedata

DOC_SEP = "<|endoftext|>"
HELDOUT_PERCENT = 5

# package -> (license as stated in /usr/share/doc/<pkg>/copyright, note)
SOURCES = {
    "bible-kjv-text": ("public-domain",
                       "King James Version text (1611), copyright expired; "
                       "Debian packaging GPL-2+ (not used)"),
    "dict-devil": ("public-domain",
                   "Ambrose Bierce, The Devil's Dictionary (1911), copyright expired"),
    "dict-jargon": ("public-domain",
                    "The Jargon File 4.4.7, placed in the public domain"),
    "python3.11-doc": ("PSF-2.0",
                       "Python 3.11 documentation (reST sources), Python Software "
                       "Foundation License Version 2"),
    "postgresql-doc-15": ("PostgreSQL",
                          "PostgreSQL 15 documentation (HTML), PostgreSQL License "
                          "(BSD/MIT-like)"),
    "sqlite3-doc": ("public-domain",
                    "SQLite 3.40 documentation (HTML), public domain"),
}


def norm_text(s):
    s = unicodedata.normalize("NFC", s)
    s = s.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    # drop control chars except newline
    s = "".join(ch for ch in s if ch == "\n" or unicodedata.category(ch)[0] != "C")
    s = s.replace("\u00a0", " ")
    lines = [ln.rstrip() for ln in s.split("\n")]
    s = "\n".join(lines)
    s = re.sub(r"\n{3,}", "\n\n", s)
    s = s.replace(DOC_SEP, "")
    return s.strip() + "\n"


# ---------------------------------------------------------------- KJV
def kjv_docs(path):
    """One document per book; verse numbers removed, a chapter is a paragraph
    block headed 'Book N'."""
    books = {}
    order = []
    rx = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = rx.match(line.rstrip("\n"))
            if not m:
                continue
            book, ch, _v, text = m.groups()
            if book not in books:
                books[book] = {}
                order.append(book)
            books[book].setdefault(int(ch), []).append(text.strip())
    for book in order:
        parts = []
        for ch in sorted(books[book]):
            parts.append(f"Chapter {ch}\n\n" + " ".join(books[book][ch]))
        yield book, "\n\n".join(parts)


# ---------------------------------------------------------------- dictd
def dict_docs(dz_path, chunk=16000):
    with gzip.open(dz_path, "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    # skip the dictfmt header entries (00-database-*)
    paras = text.split("\n\n")
    buf, n, size = [], 0, 0
    for p in paras:
        if p.startswith("00-database") or p.startswith("00database"):
            continue
        buf.append(p)
        size += len(p)
        if size >= chunk:
            yield f"part{n:04d}", "\n\n".join(buf)
            buf, size, n = [], 0, n + 1
    if buf:
        yield f"part{n:04d}", "\n\n".join(buf)


def strip_dict_header(text):
    # devil.dict starts with an ftp-era notice; drop lines with URLs
    return "\n".join(ln for ln in text.split("\n") if "http://" not in ln and "gopher" not in ln.lower())


# ---------------------------------------------------------------- reST
ROLE = re.compile(r":[a-zA-Z:]+:`~?!?([^`<]*?)\s*(?:<[^>`]*>)?`")
LINK = re.compile(r"`([^`<]+?)\s*<[^>`]*>`_+")
def rst_clean(s):
    out = []
    skip_opts = False
    for ln in s.split("\n"):
        st = ln.strip()
        if st.startswith(".. ") and "::" in st:
            d = st[3:st.index("::")].strip()
            if d in ("index", "highlight", "module", "currentmodule", "sectionauthor",
                     "moduleauthor", "testsetup", "testcleanup", "toctree", "_",
                     "seealso", "tabularcolumns", "audit-event", "impl-detail",
                     "versionadded", "versionchanged", "deprecated", "only",
                     "include", "literalinclude", "image", "figure", "raw",
                     "productionlist", "opcode", "pdbcommand"):
                skip_opts = True
                rest = st[st.index("::") + 2:].strip()
                if d in ("versionadded", "versionchanged", "deprecated") and rest:
                    label = {"versionadded": "New in version", "versionchanged": "Changed in version",
                             "deprecated": "Deprecated since version"}[d]
                    out.append(ln.replace(st, f"{label} {rest}."))
                continue
            # keep the signature of function/class directives as a line
            out.append(ln.replace(st, st[st.index("::") + 2:].strip()))
            skip_opts = True
            continue
        if st.startswith(".. _") or st.startswith(".. |") or st == "..":
            continue
        if skip_opts and re.match(r"^\s+:[\w-]+:", ln):
            continue
        skip_opts = False
        if re.fullmatch(r"([=\-~^\"'*+#`.])\1{2,}", st):
            continue  # section underline
        ln = ROLE.sub(r"\1", ln)
        ln = LINK.sub(r"\1", ln)
        ln = ln.replace("``", "").replace("**", "")
        ln = re.sub(r"\|(\w[\w-]*)\|", r"\1", ln)
        out.append(ln)
    return "\n".join(out)


# ---------------------------------------------------------------- HTML
class _Text(html.parser.HTMLParser):
    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6",
             "pre", "table", "ul", "ol", "dl", "dt", "dd", "blockquote", "section",
             "title", "hr", "td", "th"}
    SKIP = {"script", "style", "head", "nav", "noscript", "svg", "map"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skip, self.pre = [], 0, 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        elif tag == "pre":
            self.pre += 1
            self.parts.append("\n\n")
        elif tag in self.BLOCK:
            self.parts.append("\n\n" if tag not in ("br", "td", "th", "li", "dd", "dt") else "\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag == "pre":
            self.pre = max(0, self.pre - 1)
            self.parts.append("\n\n")
        elif tag in self.BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if self.skip:
            return
        if self.pre:
            self.parts.append(data)
        else:
            self.parts.append(re.sub(r"\s+", " ", data))

    def text(self):
        s = "".join(self.parts)
        s = "\n".join(ln.strip() if not ln.startswith("    ") else ln.rstrip() for ln in s.split("\n"))
        return s


def html_text(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        raw = f.read()
    p = _Text()
    try:
        p.feed(raw)
        p.close()
    except Exception:
        return ""
    return p.text()


def html_docs(root, drop_lines=()):
    for dirpath, _dirs, files in os.walk(root):
        for fn in sorted(files):
            if not fn.endswith(".html"):
                continue
            path = os.path.join(dirpath, fn)
            t = html_text(path)
            if drop_lines:
                t = "\n".join(ln for ln in t.split("\n") if ln.strip() not in drop_lines)
            yield os.path.relpath(path, root), t


# ---------------------------------------------------------------- main
def english_enough(s):
    if not s:
        return False
    letters = sum(ch.isalpha() for ch in s)
    ascii_ = sum(ord(ch) < 128 for ch in s)
    words = re.findall(r"\b(the|and|of|to|is|a|in|that)\b", s.lower())
    return letters / len(s) > 0.55 and ascii_ / len(s) > 0.97 and len(words) / max(1, len(s.split())) > 0.08


def collect(src):
    x = os.path.join(src, "x")
    for name, text in kjv_docs(os.path.join(src, "kjv.txt")):
        yield "bible-kjv-text", name, text
    for pkg, dz in (("dict-devil", "devil.dict.dz"), ("dict-jargon", "jargon.dict.dz")):
        for name, text in dict_docs(os.path.join(x, pkg, "usr/share/dictd", dz)):
            yield pkg, name, strip_dict_header(text)
    py = os.path.join(x, "python3.11-doc/usr/share/doc/python3.11/html/_sources")
    for dirpath, _d, files in os.walk(py):
        for fn in sorted(files):
            if fn.endswith(".rst.txt"):
                p = os.path.join(dirpath, fn)
                with open(p, encoding="utf-8", errors="replace") as f:
                    yield "python3.11-doc", os.path.relpath(p, py), rst_clean(f.read())
    pg = os.path.join(x, "postgresql-doc-15/usr/share/doc/postgresql-doc-15/html")
    pg_nav = {"Prev", "Next", "Up", "Home", "Prev Up", "Next Home"}
    for name, text in html_docs(pg, pg_nav):
        yield "postgresql-doc-15", name, text
    sq = os.path.join(x, "sqlite3-doc/usr/share/doc/sqlite3")
    for name, text in html_docs(sq, {"Small. Fast. Reliable.", "Choose any three.", "Home", "Menu",
                                         "About", "Documentation", "Download", "License",
                                         "Support", "Purchase", "Search", "Search Documentation",
                                         "Search Documentation Search Changelog"}):
        yield "sqlite3-doc", name, text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--versions", default="", help="JSON {package: version}")
    ap.add_argument("--eval-dir", default="")
    ap.add_argument("--eval-files", type=int, default=3)
    ap.add_argument("--eval-bytes", type=int, default=100_000)
    ap.add_argument("--haystack-bytes", type=int, default=60_000)
    a = ap.parse_args()
    versions = json.loads(a.versions) if a.versions else {}
    os.makedirs(a.out, exist_ok=True)
    stats = {p: {"package": p, "version": versions.get(p, ""), "license": SOURCES[p][0],
                 "note": SOURCES[p][1], "docs_train": 0, "docs_heldout": 0,
                 "bytes_train": 0, "bytes_heldout": 0, "docs_dropped": 0} for p in SOURCES}
    heldout_docs = []
    seen = set()
    with open(os.path.join(a.out, "train.txt"), "w", encoding="utf-8") as tr, \
         open(os.path.join(a.out, "heldout.txt"), "w", encoding="utf-8") as ho:
        for pkg, name, text in collect(a.src):
            text = norm_text(text)
            st = stats[pkg]
            digest = hashlib.sha256(text.encode()).hexdigest()
            if len(text) < 400 or not english_enough(text) or digest in seen:
                st["docs_dropped"] += 1
                continue
            seen.add(digest)
            h = int(hashlib.sha256(f"{pkg}/{name}".encode()).hexdigest()[:8], 16) % 100
            held = h < HELDOUT_PERCENT
            f = ho if held else tr
            f.write(text)
            f.write(DOC_SEP + "\n")
            n = len(text.encode("utf-8"))
            key = "heldout" if held else "train"
            st["docs_" + key] += 1
            st["bytes_" + key] += n
            if held:
                heldout_docs.append((pkg, name, text))
    man = {"doc_separator": DOC_SEP, "heldout_rule": f"sha256(package/doc)%100 < {HELDOUT_PERCENT}",
           "sources": list(stats.values()),
           "bytes_train": sum(s["bytes_train"] for s in stats.values()),
           "bytes_heldout": sum(s["bytes_heldout"] for s in stats.values())}
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1)
    if a.eval_dir:
        write_eval(a, heldout_docs)
    for s in stats.values():
        print(f"{s['package']:20s} {s['license']:14s} train {s['bytes_train']:>10,d} B "
              f"({s['docs_train']} docs)  heldout {s['bytes_heldout']:>9,d} B ({s['docs_heldout']} docs)"
              f"  dropped {s['docs_dropped']}", file=sys.stderr)
    print(f"total train {man['bytes_train']:,d} B, heldout {man['bytes_heldout']:,d} B", file=sys.stderr)


def write_eval(a, docs):
    """heldout_N.txt: held-out documents, round-robin over packages, each file
    about --eval-bytes. haystack.txt: held-out prose (KJV, Devil's Dictionary,
    Jargon File) about --haystack-bytes."""
    os.makedirs(a.eval_dir, exist_ok=True)
    prose = [d for d in docs if d[0] in ("bible-kjv-text", "dict-devil", "dict-jargon")]
    hay, used = [], set()
    for pkg, name, text in sorted(prose, key=lambda d: (d[0] != "bible-kjv-text", d[1])):
        if sum(len(t) for t in hay) >= a.haystack_bytes:
            break
        hay.append(text)
        used.add((pkg, name))
    h = "\n".join(hay)[: a.haystack_bytes]
    h = h[: h.rfind(". ") + 1] + "\n"
    with open(os.path.join(a.eval_dir, "haystack.txt"), "w", encoding="utf-8") as f:
        f.write(h)
    by_pkg = {}
    for d in docs:
        if (d[0], d[1]) not in used:
            by_pkg.setdefault(d[0], []).append(d)
    queue = []
    while any(by_pkg.values()):
        for p in sorted(by_pkg):
            if by_pkg[p]:
                queue.append(by_pkg[p].pop(0))
    for i in range(1, a.eval_files + 1):
        out, size = [], 0
        while queue and size < a.eval_bytes:
            _p, _n, t = queue.pop(0)
            t = t[: a.eval_bytes - size] if size + len(t) > a.eval_bytes * 1.2 else t
            out.append(t.rstrip("\n") + "\n")
            size += len(t)
        with open(os.path.join(a.eval_dir, f"heldout_{i}.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(out))


if __name__ == "__main__":
    main()
