"""Writes a golden that only tests read (tests/golden/README.md) the way it is
stored: gzip level 9 with no name and mtime 0 in the header, so the same text
gives the same bytes. The tests read it through tests/common/golden.h (NAME,
else NAME.gz).
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
