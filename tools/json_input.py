#!/usr/bin/env python3
"""One JSON input file for the repo's scripts: load_json_input(path, what) returns the document, or exits 2
with one line naming it when it is not a regular file (a FIFO, /dev/zero), is over 256 MiB, or is not JSON.

    from json_input import load_json_input   (with tools/ on sys.path)
"""
import json
import os
import stat
import sys


def load_json_input(path, what):
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > (256 << 20):
            raise ValueError("not a regular JSON file of at most 256 MiB")
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        print(f"{what} {path}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    print(__doc__.strip())
    sys.exit(0 if sys.argv[1:] in ([], ["-h"], ["--help"]) else 2)
