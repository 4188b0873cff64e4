#!/usr/bin/env python3
"""Inputs, outputs and flags shared by the repo's scripts (with tools/ on sys.path):

    read_regular_file(path)        its bytes, read without blocking; OSError or ValueError when it is not a
                                   regular file (a FIFO, /dev/zero), its reads would wait (/proc/kmsg), or
                                   it is over 256 MiB
    load_json_input(path, what)    the document, or exit 2 with one line naming it when read_regular_file
                                   refuses it or it is not JSON
    jsonl_rows(path, text)         (line number, value) of each non-empty line of a JSON Lines text; ValueError
                                   "PATH:LINE: not JSON (...)" at the first line that is not (or "nested too
                                   deep to be a row")
    number(low, high)              an argparse type: a finite number in [low, high] ("nan" and "inf" refused)
    check_output_file(path, flag, inputs)
                                   ValueError naming FLAG unless PATH can be written: not "", not a directory,
                                   a FIFO or a device (or a link to one), in a folder that takes a new file
                                   (a probe is created and removed), and none of
                                   INPUTS (by inode: a link or a hard link counts)
    create_new_file(path, text)    TEXT as a new file at PATH: what was there (a leftover, a link, a FIFO that
                                   would block the open) is removed first, never written through
    write_output_file(path, text)  TEXT written whole to PATH.tmp (create_new_file), then renamed over PATH
    check_executable(path, flag)   ValueError naming FLAG unless PATH is an executable regular file whose
                                   --version says "hzp VERSION"
"""
import argparse
import json
import math
import os
import stat
import subprocess
import sys
import tempfile


def read_regular_file(path, limit=256 << 20):
    """The bytes of PATH if it is a regular file of at most LIMIT bytes; OSError or ValueError otherwise. Read
    without blocking: a FIFO, or a "regular" file of the kernel's whose reads wait (/proc/kmsg), is refused."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{st.st_size} bytes, more than the {limit} accepted")
        chunks, size = [], 0
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                raise ValueError("its reads would wait for data (a kernel or device file, not a file on disk)")
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise ValueError(f"more than the {limit} bytes accepted")
            chunks.append(chunk)
    finally:
        os.close(fd)


def load_json_input(path, what):
    try:
        return json.loads(read_regular_file(path))
    except (OSError, ValueError, RecursionError) as e:
        print(f"{what} {path}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        sys.exit(2)


def jsonl_rows(path, text):
    """(line number, value) of each non-empty line of TEXT, the JSON Lines file PATH; ValueError naming the line
    of the first one that is not JSON, or is nested too deep for Python's parser."""
    for line_number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield line_number, json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{line_number}: not JSON ({e.msg})") from None
        except RecursionError:
            raise ValueError(f"{path}:{line_number}: nested too deep to be a row") from None


def number(low, high):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number in [{low:g}, {high:g}]")
        return value
    return parse


def check_output_file(path, flag, inputs=()):
    if not path:
        raise ValueError(f"{flag}: an empty path")
    if path.endswith("/") or os.path.isdir(path):
        raise ValueError(f"{flag} {path}: a folder, not a file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ValueError(f"{flag} {path}: its folder cannot be written")
    try:  # a folder of the kernel's (/proc) passes os.access and takes no new file
        probe, probe_path = tempfile.mkstemp(dir=folder, prefix=".hzp-probe-")
        os.close(probe)
        os.unlink(probe_path)
    except OSError as e:
        raise ValueError(f"{flag} {path}: its folder cannot be written ({e.strerror})") from None
    if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError(f"{flag} {path}: exists and is not a regular file")
    for given in inputs:
        if given and os.path.exists(given) and os.path.exists(path) and os.path.samefile(path, given):
            raise ValueError(f"{flag} {path}: is an input ({given}); it would be overwritten")


def create_new_file(path, text):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "w") as f:
        f.write(text)


def write_output_file(path, text):
    create_new_file(path + ".tmp", text)
    os.replace(path + ".tmp", path)


def check_executable(path, flag):
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise ValueError(f"{flag} {path}: not an executable (build first: bash tools/setup.sh)")
    try:  # an executable that is not hzp (/bin/true) would fail every run, or pass none
        first = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout.split("\n")[0]
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError) as e:
        raise ValueError(f"{flag} {path}: cannot run it ({e})") from None
    if not first.startswith("hzp "):
        raise ValueError(f"{flag} {path}: not hzp (its --version says {first[:60]!r}, not \"hzp VERSION\")")


if __name__ == "__main__":
    print(__doc__.strip())
    sys.exit(0 if sys.argv[1:] in ([], ["-h"], ["--help"]) else 2)
