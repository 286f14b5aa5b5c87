"""Shared by the golden-writing scripts. write_gz writes a golden that only
tests read (tests/golden/README.md) the way it is stored: gzip level 9 with no
name and mtime 0 in the header, so the same text gives the same bytes. The
tests read it through tests/common/golden.h (NAME, else NAME.gz).
"""
import gzip
import os


def write_gz(path, text):
    """Writes text (UTF-8) gzip-compressed to path, which ends in .gz, atomically."""
    assert path.endswith(".gz"), path
    tmp = path + ".tmp"
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as gz:
        gz.write(text.encode("utf-8"))
    os.replace(tmp, path)


# The tokenizer golden cases: encode each text with and without special
# tokens, decode the ids back (with and without skipping special tokens), and
# decode each id list. enc(text, add_special) -> ids, dec(ids, skip) -> text.
def run_cases(enc, dec, texts, id_lists):
    cases = []
    for t in texts:
        ids = enc(t, True)
        ids_ns = enc(t, False)
        cases.append({"text": t, "ids": ids, "ids_no_special": ids_ns, "decoded": dec(ids, False),
                      "decoded_skip": dec(ids, True)})
    dcases = [{"ids": ids, "text": dec(ids, False), "text_skip": dec(ids, True)} for ids in id_lists]
    return cases, dcases
