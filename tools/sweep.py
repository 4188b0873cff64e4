#!/usr/bin/env python3
"""Simulates many scenarios with `hzp simulate` and tabulates and plots the results.

    python3 tools/sweep.py [--hzp build/hzp] [--jobs N] [--out DIR] [--no-svg] [--keep-runs] SCENARIO_OR_DIR...
    python3 tools/sweep.py BASE.json --grid KEY=V1,V2,... [--grid KEY=...]... [options]
    python3 tools/sweep.py ... --slurm [--sbatch OPTION]...    then    sbatch OUT/slurm/sweep.sbatch
    python3 tools/sweep.py --collect --out OUT

--grid KEY=V1,V2,... sweeps the cartesian product of its values over one base scenario: each point is the
base with `--set KEY=V` edits, resolved by `hzp validate` (presets resolve as in the file) and written to
OUT/grid/NNN.json; values are split at commas (JSON values with commas cannot be grid values).

--slurm runs nothing here: it writes OUT/slurm/files.txt (the scenarios, one per line) and
OUT/slurm/sweep.sbatch, a job array of one task per scenario (at most --jobs at a time; each --sbatch OPTION
becomes an "#SBATCH OPTION" line, e.g. --sbatch=--partition=cpu --sbatch=--time=01:00:00). Each task runs
`sweep.py --task I`, which simulates scenario I into OUT/rows/I.json; `sweep.py --collect --out OUT`, once the
array is done, writes the same results.csv, plots and index.html as a local sweep (a scenario whose task
left no row is reported as failed). Inside one Slurm allocation, a plain sweep runs its local processes.

Directories are expanded to their *.json files (sorted). Each scenario is first resolved with
`hzp validate` (its metadata — model, GPU type, policy, sharding — comes from the resolved JSON on stdout),
then simulated with `hzp simulate`, each in its own process, N scenarios at a time. A scenario that fails
is reported in the table with its exit status and last stderr line; the sweep goes on, and exits 1 at the
end (2 on a bad command line, 0 when every scenario was simulated).

Writes into DIR (default out/sweep), every file through a temporary file and a rename:
  results.csv                  one row per scenario (rewritten as each scenario finishes)
  mfu_vs_gpus.png/.svg         MFU vs GPU count, one line per (model, policy); no .svg with --no-svg
  memory_by_policy.png/.svg    peak memory per category per policy, one panel per model
  exposed_comm_by_policy.png/.svg  exposed communication vs GPU count, one panel per model
  index.html                   the plots, the table and the command line that produced them
  runs/<name>/                 summary.json and timeline.json of every scenario (only with --keep-runs)
An earlier sweep's grid points (grid/NNN.json) and runs (runs/NNN-NAME/ holding only a run's files) in DIR
are removed first: what DIR holds is this sweep's. Anything else there is left alone.

Plotting needs matplotlib (Debian: python3-matplotlib, for /usr/bin/python3). When the interpreter running
this script lacks it and /usr/bin/python3 has it, the script re-runs itself under /usr/bin/python3.
"""
import argparse
import concurrent.futures
import csv
import datetime
import hashlib
import html
import io
import itertools
import json
import math
import os
import shlex
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from json_input import read_regular_file  # noqa: E402  (a FIFO, /dev/zero or /proc/kmsg refused, not waited on)

SYSTEM_PYTHON = "/usr/bin/python3"
REEXEC_ENV = "HZP_SWEEP_REEXEC"
GiB = 2.0**30
GB = 1e9
MEMORY_CATEGORIES = ["params", "grads", "optimizer", "activations", "buffers"]
# Policies in plots and legends follow this order (from replicated to the papers' policies); others after.
POLICY_ORDER = ["ddp", "zero1", "zero2", "zero3", "fsdp", "zeropp", "hsdp", "mics", "amsp", "asynchzp", "custom"]
PLOT_DPI = 100

# CSV columns, in order. Numbers are rounded to 6 significant digits when written.
COLUMNS = [
    "scenario", "file", "model", "gpu_type", "gpus", "nodes", "policy",
    "sharding", "recompute",
    "step_time_s", "mfu", "tokens_per_gpu_per_s", "exposed_comm_s", "overlap_fraction",
    *[f"peak_{c}_GiB" for c in MEMORY_CATEGORIES], "peak_total_GiB", "gpu_memory_GiB", "fits_memory",
    "comm_intra_node_GB_per_gpu", "comm_inter_node_GB_per_gpu", "sim_wall_s", "error",
]


class UsageError(Exception):
    """A bad command line: reported in one line, exit status 2."""


# ---------------------------------------------------------------------------------------------------------
# Command line and inputs

def parse_args(argv):
    """Parses the command line; raises UsageError on a bad value."""
    parser = argparse.ArgumentParser(
        prog="sweep.py", description=__doc__.split("\n\n")[0], epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO_OR_DIR",
                        help="scenario JSON files, or directories whose *.json files are all simulated")
    parser.add_argument("--hzp", default="build/hzp", help="the hzp binary (default: build/hzp)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="scenarios simulated at a time (default: the number of CPUs)")
    parser.add_argument("--out", default=os.path.join("out", "sweep"), help="output folder (default: out/sweep)")
    parser.add_argument("--no-svg", action="store_true", help="write the plots as PNG only (no SVG copies)")
    parser.add_argument("--keep-runs", action="store_true",
                        help="keep every scenario's summary.json and timeline.json under OUT/runs/")
    parser.add_argument("--progress-s", type=float, default=30.0,
                        help="while no scenario finishes, a progress line every this many seconds (default 30)")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="sweep these values of KEY over the one base scenario given (repeatable: the product)")
    parser.add_argument("--slurm", action="store_true",
                        help="write a Slurm job array under OUT/slurm instead of running (see below)")
    parser.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                        help="an #SBATCH line of the job array (repeatable), e.g. --sbatch=--partition=cpu")
    parser.add_argument("--task", type=int, metavar="I",
                        help="run scenario I of OUT/slurm/files.txt, a job array task (-1: SLURM_ARRAY_TASK_ID)")
    parser.add_argument("--collect", action="store_true", help="the report of a finished job array in OUT")
    args = parser.parse_args(argv)
    args.formats = ["png"] if args.no_svg else ["png", "svg"]
    check_out_dir(args.out)
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    if not 0.01 <= args.progress_s <= 86400:  # also refuses nan
        raise UsageError(f"--progress-s must be in [0.01, 86400] seconds, got {args.progress_s}")
    for option in args.sbatch:  # each is one "#SBATCH" line: a newline would start a shell command
        if not option.strip() or any(ord(c) < 0x20 or ord(c) == 0x7f for c in option):
            raise UsageError(f"--sbatch {option!r}: one option on one line, without control characters")
    if args.task is not None or args.collect:
        if args.scenarios or args.grid or args.slurm:
            raise UsageError("--task and --collect read OUT/slurm/files.txt: give no scenarios, --grid or --slurm")
        if args.task is not None and args.task == -1:
            if "SLURM_ARRAY_TASK_ID" not in os.environ:
                raise UsageError("--task -1 reads SLURM_ARRAY_TASK_ID, which is not set")
            args.task = int(os.environ["SLURM_ARRAY_TASK_ID"])
        args.files = read_file_list(args.out)
        if args.task is not None and not 0 <= args.task < len(args.files):
            raise UsageError(f"--task {args.task}: OUT/slurm/files.txt has {len(args.files)} scenarios")
        check_output_paths(args, args.files, [])
        args.hzp = resolve_binary(args.hzp)
        return args
    if not args.scenarios:
        raise UsageError("no scenarios given (pass scenario files or directories of *.json)")
    args.hzp = resolve_binary(args.hzp)
    check_not_an_output(args.hzp, args.out)
    if args.grid:
        if len(args.scenarios) != 1 or not os.path.isfile(args.scenarios[0]):
            raise UsageError("--grid needs exactly one base scenario file")
        inputs = [args.scenarios[0]]
        args.files = None
    else:
        args.files = expand_scenarios(args.scenarios)
        inputs = args.files
    for path in inputs:  # each scenario, and the Hugging Face config its model starts from
        check_not_an_output(path, args.out)
        hf = hf_config_of(path)
        if hf:
            check_not_an_output(hf, args.out)
    grid = parse_grid(args.grid) if args.grid else None  # checked before anything is removed
    if args.slurm:  # files.txt holds one path a line, and OUT goes into the script's #SBATCH lines
        for path in [args.out] + (inputs if grid else args.files):
            if has_control(os.path.abspath(path)):
                raise UsageError(f"--slurm: path {path!r} holds a newline or another control character "
                                 "(OUT/slurm/files.txt holds one path a line)")
    points = math.prod(len(values) for _, values in grid) if grid else len(args.files)
    grid_files = [os.path.join(args.out, "grid", f"{i:03d}.json") for i in range(points)] if grid else args.files
    check_output_paths(args, grid_files, grid_files if grid else [])
    remove_earlier_outputs(args.out)  # every input checked: this sweep's grid and runs replace an earlier one's
    if grid:
        args.files = grid_scenarios(args.hzp, args.scenarios[0], grid, args.out)
    return args


def hf_config_of(path):
    """model.from_hf_config of the scenario file at `path`, relative to its folder as hzp reads it; None when
    there is none (or the file is no scenario: hzp says so when it runs). UsageError when the file is not a
    regular file that can be read without waiting (a FIFO, /dev/zero, /proc/kmsg)."""
    try:
        data = read_regular_file(path, 64 << 20)
    except OSError as e:
        raise UsageError(f"scenario {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"scenario {path}: {e}") from None
    try:
        model = json.loads(data).get("model", {})
        hf = model.get("from_hf_config") if isinstance(model, dict) else None
    except (ValueError, AttributeError, RecursionError):
        return None
    return os.path.join(os.path.dirname(path), hf) if isinstance(hf, str) and hf else None


OUTPUT_NAMES = ("results.csv", "index.html", "rows", "slurm", "grid", "runs")
PLOT_STEMS = ("mfu_vs_gpus", "memory_by_policy", "exposed_comm_by_policy")


def has_control(text):
    return any(ord(c) < 0x20 or ord(c) == 0x7f for c in text)


def run_dir_of(out, i, path):
    """OUT/runs/NNN-STEM, where --keep-runs keeps scenario I's run."""
    return os.path.join(out, "runs", f"{i:03d}-{os.path.splitext(os.path.basename(path))[0]}")


def check_output_paths(args, files, grid_files):
    """Before anything is simulated, created or removed: every folder the sweep writes into under OUT must be a
    folder or absent, never a link (its files would land where it points, outside OUT), and every file it
    writes must not be a folder (the rename onto it would fail after every simulation ran). FILES are the
    scenarios of this run, GRID_FILES the grid points it writes."""
    out = args.out
    folders, outputs = [], []
    if args.task is not None:
        folders.append(os.path.join(out, "rows"))
        outputs.append(os.path.join(out, "rows", f"{args.task}.json"))
        files = [files[args.task]]
        indexes = [args.task]
    else:
        indexes = range(len(files))
    if args.slurm:
        folders += [os.path.join(out, "slurm"), os.path.join(out, "slurm", "logs")]
        outputs += [os.path.join(out, "slurm", n) for n in ("files.txt", "sweep.sbatch")]
    elif args.task is None:
        outputs += [os.path.join(out, n) for n in ("results.csv", "index.html")]
        outputs += [os.path.join(out, f"{stem}.{fmt}") for stem in PLOT_STEMS for fmt in args.formats]
    if grid_files:
        folders.append(os.path.join(out, "grid"))
        outputs += grid_files
    if args.keep_runs and not args.slurm and not args.collect:
        folders.append(os.path.join(out, "runs"))
        folders += [run_dir_of(out, i, path) for i, path in zip(indexes, files)]
    for folder in folders:
        if os.path.islink(folder):
            raise UsageError(f"{folder}: is a link; the sweep writes into it, and would write where it points "
                             "(remove it or pick another --out)")
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise UsageError(f"{folder}: exists and is not a folder; the sweep writes into it")
    for path in outputs:
        if os.path.isdir(path) and not os.path.islink(path):
            raise UsageError(f"{path}: is a folder; the sweep writes this file (remove it or pick another --out)")


def check_not_an_output(path, out):
    """An input (a scenario, its Hugging Face config, the hzp binary) may not be one of the files the sweep
    writes in OUT (its report, plots, rows, grid, runs): it would be overwritten."""
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(out))
    head = rel.split(os.sep)[0]
    if head != ".." and (head in OUTPUT_NAMES or (os.sep not in rel and rel.endswith((".png", ".svg")))):
        raise UsageError(f"{path}: is where the sweep writes its output in --out {out}; move it or pick another --out")


def check_out_dir(out):
    """--out must be a folder hzp can create and write: a file, an empty name or /proc/x is a usage error.
    Nothing is created here (main does, once every argument is checked): a refused run leaves no folders."""
    if not out:
        raise UsageError("--out: an empty path")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out}: exists and is not a folder")
    existing = os.path.abspath(out)
    while not os.path.exists(existing):  # the nearest folder that exists: where the first new one would go
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"--out {out}: {existing} is not a folder")
    try:
        probe = tempfile.NamedTemporaryFile(dir=existing, prefix=".sweep-probe-")
        probe.close()
    except OSError as e:
        raise UsageError(f"--out {out}: cannot write there ({e.strerror or e})")


def parse_grid(specs):
    """[(key, [values])] from --grid KEY=V1,V2,..., in the order given."""
    grid = []
    for spec in specs:
        key, eq, values = spec.partition("=")
        if not eq or not key or not values:
            raise UsageError(f"--grid {spec!r}: expected KEY=V1,V2,...")
        if key in (k for k, _ in grid):
            raise UsageError(f"--grid: {key} given twice")
        grid.append((key, values.split(",")))
    return grid


# What a sweep writes under OUT/grid and OUT/runs: its files are named so, and nothing else there is touched.
GRID_FILE = re.compile(r"[0-9]{3,}\.json")
RUN_DIR = re.compile(r"[0-9]{3,}-.+")
RUN_FILES = {"summary.json", "timeline.json", "timeline.json.gz", "scenario.json"}


def remove_earlier_outputs(out):
    """Removes what an earlier sweep left in OUT/grid and OUT/runs (the ninth attack of issue 35: a reused --out
    kept the earlier grid points and runs beside this sweep's): grid point files, and run folders that hold
    nothing but a run's files. Links and anything else are left alone."""
    grid = os.path.join(out, "grid")
    if os.path.isdir(grid) and not os.path.islink(grid):
        for name in os.listdir(grid):
            path = os.path.join(grid, name)
            if GRID_FILE.fullmatch(name) and os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)
    runs = os.path.join(out, "runs")
    if os.path.isdir(runs) and not os.path.islink(runs):
        for name in os.listdir(runs):
            path = os.path.join(runs, name)
            if not RUN_DIR.fullmatch(name) or os.path.islink(path) or not os.path.isdir(path):
                continue
            inside = os.listdir(path)
            if all(f in RUN_FILES and os.path.isfile(os.path.join(path, f)) and
                   not os.path.islink(os.path.join(path, f)) for f in inside):
                shutil.rmtree(path)


def grid_scenarios(hzp, base, grid, out):
    """The grid's points as resolved scenario files OUT/grid/NNN.json, named after their edits."""
    folder = os.path.join(out, "grid")
    os.makedirs(folder, exist_ok=True)
    stem = os.path.splitext(os.path.basename(base))[0]
    files = []
    for i, point in enumerate(itertools.product(*[[(k, v) for v in values] for k, values in grid])):
        sets = [f"{k}={v}" for k, v in point]
        args = ["validate", base] + [a for s in sets for a in ("--set", s)]
        stdout, error = run_hzp(hzp, args)
        if error:
            raise UsageError(f"--grid point {' '.join(sets)}: {error}")
        resolved = json.loads(stdout[stdout.index("{"):])
        resolved["name"] = point_name(stem, sets)
        path = os.path.join(folder, f"{i:03d}.json")
        write_atomic(path, json.dumps(resolved, indent=2) + "\n")
        files.append(path)
    return files


NAME_BYTES = 128  # a scenario name's limit (shared/scenario/scenario_parser.cc read_label: printable text)


def point_name(stem, sets):
    """The grid point's scenario name: the base's stem and its edits, in printable ASCII (anything else a "?");
    past 128 bytes, its first bytes and a hash of the whole, so every point's name is valid and unique."""
    full = stem + " " + " ".join(sets)
    name = "".join(c if 0x20 <= ord(c) < 0x7f else "?" for c in full)
    if len(name) <= NAME_BYTES and name == full:
        return name
    digest = hashlib.sha256(full.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return name[:NAME_BYTES - len(digest) - 2].rstrip() + " #" + digest


def read_file_list(out):
    path = os.path.join(out, "slurm", "files.txt")
    try:
        text = read_regular_file(path, 64 << 20).decode("utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror} (write it with --slurm first)")
    except ValueError as e:
        raise UsageError(f"{path}: {e}")
    return [line for line in text.split("\n") if line.strip()]


def resolve_binary(hzp):
    """Returns the path of the hzp binary: a path as given, or a bare name looked up in PATH."""
    path = hzp if os.sep in hzp else shutil.which(hzp)
    if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise UsageError(f"hzp binary not found or not executable: {hzp} "
                         "(build it with `cmake --build build -j2`, or pass --hzp PATH)")
    return path


def expand_scenarios(paths):
    """Expands directories to their *.json files (sorted); keeps files in the order given, without repeats."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".json"))
            if not found:
                raise UsageError(f"no *.json scenarios in directory {path}")
            for f in found:  # each file of the folder is checked as one given by name would be
                if not os.path.isfile(f):
                    raise UsageError(f"scenario {f}: not a regular file (a FIFO, a device, a folder or a broken "
                                     "link)")
            files.extend(found)
        elif os.path.isfile(path):
            files.append(path)
        elif os.path.exists(path):
            raise UsageError(f"scenario {path}: not a regular file or a directory (a FIFO or a device?)")
        else:
            raise UsageError(f"no such scenario file or directory: {path}")
    return list(dict.fromkeys(files))


def import_pyplot():
    """Returns matplotlib.pyplot with the Agg backend, re-running the script under /usr/bin/python3 when this
    interpreter has no matplotlib and that one may (once: the environment marks the re-run)."""
    try:
        import matplotlib
    except ImportError:
        if os.environ.get(REEXEC_ENV) or not os.access(SYSTEM_PYTHON, os.X_OK) \
                or os.path.realpath(sys.executable) == os.path.realpath(SYSTEM_PYTHON):
            raise UsageError("matplotlib is not installed (Debian: apt-get install python3-matplotlib, "
                             f"then run with {SYSTEM_PYTHON})")
        print(f"sweep: no matplotlib in {sys.executable}; re-running under {SYSTEM_PYTHON}", file=sys.stderr)
        os.environ[REEXEC_ENV] = "1"
        os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON] + sys.argv)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# ---------------------------------------------------------------------------------------------------------
# Running hzp

def run_hzp(hzp, args):
    """Runs `hzp ARGS...` in its own process; returns (stdout, None) or (stdout, error message)."""
    try:
        proc = subprocess.run([hzp, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        return "", f"{args[0]}: cannot run {hzp}: {e.strerror}"
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        last = lines[-1].strip() if lines else "(no stderr)"
        return proc.stdout, f"{args[0]}: exit {proc.returncode}: {last}"
    return proc.stdout, None


def simulate_one(hzp, path, run_dir):
    """Resolves and simulates one scenario. Returns (resolved scenario or None, summary or None, error or
    None). run_dir receives summary.json and timeline.json (None: a temporary folder, removed afterwards)."""
    stdout, error = run_hzp(hzp, ["validate", path])
    if error:
        return None, None, error
    try:
        resolved = json.loads(stdout)
    except json.JSONDecodeError as e:
        return None, None, f"validate: stdout is not the resolved JSON ({e})"
    with tempfile.TemporaryDirectory(prefix="hzp-sweep-") as tmp:
        out = run_dir or tmp
        _, error = run_hzp(hzp, ["simulate", path, "--out", out])
        if error:
            return resolved, None, error
        try:
            return resolved, json.loads(read_regular_file(os.path.join(out, "summary.json"), 256 << 20)), None
        except (OSError, ValueError) as e:
            return resolved, None, f"simulate: no readable summary.json ({e})"


def result_row(path, resolved, summary, error):
    """One CSV row (a dict over COLUMNS) from a scenario's resolved form and simulation summary."""
    row = {c: "" for c in COLUMNS}
    row["file"] = path
    row["scenario"] = os.path.splitext(os.path.basename(path))[0]
    row["error"] = error or ""
    if resolved:
        cluster, policy = resolved["cluster"], resolved["policy"]
        row.update({
            "scenario": resolved.get("name", row["scenario"]),
            "model": resolved["model"]["name"],
            "gpu_type": cluster["gpu"]["type"],
            "gpus": cluster["nodes"] * cluster["gpus_per_node"],
            "nodes": cluster["nodes"],
            "policy": policy.get("preset", "custom"),
            "recompute": resolved["training"]["recompute"],
            "gpu_memory_GiB": cluster["gpu"]["memory_GiB"],
        })
        row["sharding"] = sharding_notation(policy["sharding"])
    if summary:
        breakdown = summary["peak_memory_breakdown_bytes"]
        row.update({
            "scenario": summary.get("scenario", row["scenario"]),
            "gpus": summary["gpus"],
            "policy": summary.get("policy", row["policy"]),
            "step_time_s": summary["step_time_s"],
            "mfu": summary["mfu"],
            "tokens_per_gpu_per_s": summary["tokens_per_gpu_per_s"],
            "exposed_comm_s": summary["exposed_comm_s"],
            "overlap_fraction": summary["overlap_fraction"],
            "peak_total_GiB": summary["peak_memory_bytes"] / GiB,
            "gpu_memory_GiB": summary["gpu_memory_bytes"] / GiB,
            "fits_memory": summary["fits_memory"],
            "comm_intra_node_GB_per_gpu": summary["comm_bytes"]["intra_node_per_gpu"] / GB,
            "comm_inter_node_GB_per_gpu": summary["comm_bytes"]["inter_node_per_gpu"] / GB,
            "sim_wall_s": summary["sim_wall_s"],
        })
        for c in MEMORY_CATEGORIES:
            row[f"peak_{c}_GiB"] = breakdown.get(c, 0.0) / GiB
    return row


SHARDING_LEGEND = ("P/G/OS[s0,s1]: parameters / gradients / optimizer states, each sharded over s0 GPUs of a "
                   "node x s1 nodes ([1,1] = replicated)")


def sharding_notation(sharding):
    """The one notation of every hzp output, e.g. 'P[8,1] G[8,4] OS[8,4]' (SHARDING_LEGEND explains it)."""
    return " ".join(f"{name}[{sharding[state][0]},{sharding[state][1]}]"
                    for name, state in (("P", "params"), ("G", "grads"), ("OS", "optimizer")))


def outcome(row):
    """How a row reads in progress lines and the page: the MFU, marked when the run cannot happen."""
    if row["error"]:
        return f"FAILED ({row['error']})"
    mfu = f"MFU {float(row['mfu']) * 100:.1f} %"
    if not row["fits_memory"]:
        return (f"({mfu}) NOT RUNNABLE: needs {float(row['peak_total_GiB']):.1f} GiB of "
                f"{float(row['gpu_memory_GiB']):.1f} GiB per GPU")
    return mfu


def ranked(rows):
    """Rows for the page: runnable first, then those that do not fit in memory, then failures (each group in
    input order), so a configuration that cannot run never looks like a winner."""
    def tier(row):
        return 2 if row["error"] else 0 if row["fits_memory"] else 1
    return sorted((r for r in rows if r is not None), key=tier)


def run_sweep(args, on_row):
    """Simulates args.files, args.jobs at a time; calls on_row(index, row) as each finishes (in this
    thread). Returns the rows in input order."""
    rows = [None] * len(args.files)

    def task(i, path):
        run_dir = run_dir_of(args.out, i, path) if args.keep_runs else None
        start = time.monotonic()
        row = result_row(path, *simulate_one(args.hzp, path, run_dir))
        if run_dir and os.path.isdir(run_dir) and not os.listdir(run_dir):
            os.rmdir(run_dir)  # a simulation refused before it wrote anything leaves no empty folder
        return i, row, time.monotonic() - start

    # Threads only wait: every simulation runs in its own hzp process. A line per finished scenario, with
    # the elapsed time and an ETA, and while none finishes a plain line every --progress-s seconds, so a log
    # file (Slurm, CI) shows the sweep is alive.
    sweep_start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(task, i, path) for i, path in enumerate(args.files)]
        pending, done = set(futures), 0
        try:
            while pending:
                finished, pending = concurrent.futures.wait(pending, timeout=args.progress_s,
                                                            return_when=concurrent.futures.FIRST_COMPLETED)
                if not finished:
                    print(f"sweep: {progress_text(done, len(futures), time.monotonic() - sweep_start)}, "
                          f"{min(args.jobs, len(pending))} running", file=sys.stderr)
                for future in finished:
                    i, row, wall = future.result()
                    rows[i] = row
                    done += 1
                    print(f"sweep: [{done}/{len(futures)}] {row['scenario']}: {outcome(row)}, {wall:.1f} s; "
                          f"{progress_text(done, len(futures), time.monotonic() - sweep_start)}", file=sys.stderr)
                    on_row(i, row)
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return rows


def clock(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def progress_text(done, total, elapsed):
    """'3/10 done, elapsed 0:00:12, ETA 0:00:28' (no ETA before the first scenario finishes)."""
    eta = f", ETA {clock(elapsed / done * (total - done))}" if done else ""
    return f"{done}/{total} done, elapsed {clock(elapsed)}{eta}"


# ---------------------------------------------------------------------------------------------------------
# Output files

def write_atomic(path, data):
    """Writes str or bytes to path through a temporary file in the same folder and a rename, so a reader
    (or an interrupted run) never sees a half-written file and the previous version survives a failure."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def format_cell(value):
    """A CSV/HTML cell: numbers to 6 significant digits, booleans as true/false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def csv_text(rows):
    """The results table as CSV text (header + one line per finished scenario)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        if row is not None:
            writer.writerow([format_cell(row[c]) for c in COLUMNS])
    return buf.getvalue()


def save_figure(fig, out, stem, formats):
    """Lays the figure out and saves it as OUT/STEM.<format> for each format (each atomically); returns the
    PNG's file name."""
    fig.tight_layout()
    for fmt in formats:
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=PLOT_DPI, bbox_inches="tight")
        write_atomic(os.path.join(out, f"{stem}.{fmt}"), buf.getvalue())
    return f"{stem}.png"


# ---------------------------------------------------------------------------------------------------------
# Plots

def simulated(rows):
    """The rows that have simulation results."""
    return [r for r in rows if r is not None and not r["error"]]


def group_by(rows, key):
    """{key(row): [rows]} in first-seen order."""
    groups = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return groups


def machine_key(row):
    """What one panel shows: a model on one GPU type."""
    return row["model"], row["gpu_type"]


def machine_label(key, several_types):
    """'model' or, when the sweep spans several GPU types, 'model on gpu_type'."""
    model, gpu_type = key
    return f"{model} on {gpu_type}" if several_types else model


def several_gpu_types(rows):
    """Whether the rows span more than one GPU type (labels then name it)."""
    return len({r["gpu_type"] for r in rows}) > 1


def panel_grid(plt, count, width=5.0, height=3.8):
    """A figure with one axis per panel, at most 3 per row; returns (fig, axes used)."""
    cols = min(3, count)
    nrows = math.ceil(count / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(width * cols, height * nrows), squeeze=False)
    flat = [ax for line in axes for ax in line]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


MARKERS = ["o", "s", "^", "D", "v", "P", "*", "X", "<", ">"]


def policy_rank(row):
    """Sort key putting rows in POLICY_ORDER (unknown policies last, by name); stable otherwise."""
    policy = row["policy"]
    return (POLICY_ORDER.index(policy) if policy in POLICY_ORDER else len(POLICY_ORDER), policy)


def policy_colors(plt, rows):
    """{policy: color}, the same in every plot of one sweep (rows are in policy order)."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    return {p: cycle[i % len(cycle)] for i, p in enumerate(policies)}


def draw_lines(ax, rows, series_key, label, style, value):
    """One line per series over GPU count (log2 x axis, ticks at the counts present); style(key) gives the
    line's color and marker. Points that do not fit in memory are overdrawn with a large 'x'."""
    for key, series in group_by(rows, series_key).items():
        series = sorted(series, key=lambda r: int(r["gpus"]))
        ax.plot([int(r["gpus"]) for r in series], [value(r) for r in series], label=label(key), **style(key))
        oom = [r for r in series if not r["fits_memory"]]
        if oom:
            ax.plot([int(r["gpus"]) for r in oom], [value(r) for r in oom], linestyle="none", marker="x",
                    markersize=12, color=style(key)["color"])
    counts = sorted({int(r["gpus"]) for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.minorticks_off()
    ax.set_xlabel("GPUs")
    ax.grid(True, alpha=0.3)


def plot_mfu_vs_gpus(plt, rows, out, formats):
    """mfu_vs_gpus: MFU vs GPU count, one line per (model, policy) (and GPU type when several); color by
    policy, marker by model."""
    several = several_gpu_types(rows)
    colors = policy_colors(plt, rows)
    machines = list(group_by(rows, machine_key))
    rows = sorted(rows, key=lambda r: (machines.index(machine_key(r)), policy_rank(r)))  # legend order
    fig, ax = plt.subplots(figsize=(9, 5.5))
    draw_lines(ax, rows, lambda r: (r["model"], r["gpu_type"], r["policy"]),
               lambda k: f"{machine_label(k[:2], several)} / {k[2]}",
               lambda k: {"color": colors[k[2]], "marker": MARKERS[machines.index(k[:2]) % len(MARKERS)]},
               lambda r: float(r["mfu"]) * 100)
    ax.set_ylabel("MFU (%)")
    ax.set_ylim(bottom=0)
    ax.set_title("MFU vs GPU count (x: does not fit in memory)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    name = save_figure(fig, out, "mfu_vs_gpus", formats)
    plt.close(fig)
    return name


def plot_exposed_comm(plt, rows, out, formats):
    """exposed_comm_by_policy: exposed communication seconds vs GPU count, one panel per model, one line
    per policy."""
    several = several_gpu_types(rows)
    colors = policy_colors(plt, rows)
    machines = group_by(rows, machine_key)
    fig, axes = panel_grid(plt, len(machines))
    for ax, (key, panel) in zip(axes, machines.items()):
        draw_lines(ax, panel, lambda r: r["policy"], str, lambda p: {"color": colors[p], "marker": "o"},
                   lambda r: float(r["exposed_comm_s"]))
        ax.set_ylabel("exposed communication (s)")
        ax.set_ylim(bottom=0)
        ax.set_title(machine_label(key, several), fontsize="medium")
    # One legend for every panel, outside them (a legend per panel covered its lines).
    handles, labels = {}, []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = handle
                labels.append(label)
    fig.legend([handles[label] for label in labels], labels, loc="center left", bbox_to_anchor=(1.0, 0.5),
               fontsize="small", title="policy")
    fig.suptitle("Exposed communication per step by policy (x: does not fit in memory)")
    name = save_figure(fig, out, "exposed_comm_by_policy", formats)
    plt.close(fig)
    return name


def largest_fitting_count(panel):
    """The largest GPU count at which some scenario of the panel fits (the largest count if none fits)."""
    fitting = [int(r["gpus"]) for r in panel if r["fits_memory"]]
    return max(fitting or [int(r["gpus"]) for r in panel])


def plot_memory(plt, rows, out, formats):
    """memory_by_policy: stacked peak memory per category, one bar per policy, one panel per model at its
    largest fitting GPU count; the GPU memory as a dashed line."""
    several = several_gpu_types(rows)
    machines = group_by(rows, machine_key)
    fig, axes = panel_grid(plt, len(machines))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, panel) in zip(axes, machines.items()):
        gpus = largest_fitting_count(panel)
        bars = [r for r in panel if int(r["gpus"]) == gpus]
        policies = [r["policy"] for r in bars]
        # A policy names its bar; several bars of one policy (a grid) are told apart by scenario, wrapped.
        labels = [r["policy"] if policies.count(r["policy"]) == 1 else textwrap.fill(r["scenario"], 18) for r in bars]
        bottom = [0.0] * len(bars)
        for color, category in zip(colors, MEMORY_CATEGORIES):
            heights = [float(r[f"peak_{category}_GiB"]) for r in bars]
            ax.bar(labels, heights, bottom=bottom, color=color, label=category)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.axhline(float(bars[0]["gpu_memory_GiB"]), color="black", linestyle="--", label="GPU memory")
        ax.set_ylabel("peak memory per GPU (GiB)")
        ax.set_title(f"{machine_label(key, several)}, {gpus} GPUs", fontsize="medium")
        plt.setp(ax.get_xticklabels(), rotation=45, ha="right", fontsize="x-small" if len(bars) > 6 else "small")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    fig.suptitle("Peak memory per GPU by category and policy, at the largest GPU count where one fits")
    name = save_figure(fig, out, "memory_by_policy", formats)
    plt.close(fig)
    return name


def make_plots(plt, rows, out, formats):
    """Draws every plot from the simulated rows; returns the PNG file names (none if nothing simulated)."""
    ok = sorted(simulated(rows), key=policy_rank)
    if not ok:
        return []
    return [plot(plt, ok, out, formats) for plot in (plot_mfu_vs_gpus, plot_memory, plot_exposed_comm)]


# ---------------------------------------------------------------------------------------------------------
# index.html

# The columns the page shows until "all columns" is ticked (results.csv always has every one).
PAGE_COLUMNS = ["scenario", "model", "gpu_type", "gpus", "policy", "sharding", "step_time_s", "mfu",
                "tokens_per_gpu_per_s", "exposed_comm_s", "peak_total_GiB", "fits_memory"]

# Click a header to sort by it (numbers as numbers), again to reverse; the box shows every column.
SORT_SCRIPT = """
function sortBy(th) {
  const table = th.closest('table'), col = Array.from(th.parentNode.children).indexOf(th);
  const rows = Array.from(table.querySelectorAll('tr')).slice(1);
  const up = th.dataset.dir !== 'up';
  th.dataset.dir = up ? 'up' : 'down';
  const key = r => { const t = r.children[col].textContent, n = parseFloat(t); return isNaN(n) ? t : n; };
  rows.sort((a, b) => { const x = key(a), y = key(b); return (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1); });
  rows.forEach(r => table.appendChild(r));
}
"""


def index_html(rows, plots, command, note):
    """The report page: command line, plots, and the results table (failed scenarios highlighted), sortable
    by any column, the main columns shown unless every one is asked for."""
    esc = html.escape

    def cls(c):
        return "" if c in PAGE_COLUMNS else ' class="extra"'
    head = '<th onclick="sortBy(this)">outcome</th>' + "".join(
        f'<th{cls(c)} onclick="sortBy(this)">{esc(c)}</th>' for c in COLUMNS)
    body = []
    for row in ranked(rows):
        kind = ' class="failed"' if row["error"] else "" if row["fits_memory"] else ' class="oom"'
        cells = f"<td>{esc(outcome(row))}</td>" + "".join(
            f"<td{cls(c)}>{esc(format_cell(row[c]))}</td>" for c in COLUMNS)
        body.append(f"<tr{kind}>{cells}</tr>")
    images = "\n".join(f'<p><img src="{esc(p)}" alt="{esc(p)}"></p>' for p in plots)
    failed = sum(1 for r in rows if r is not None and r["error"])
    oom = sum(1 for r in rows if r is not None and not r["error"] and not r["fits_memory"])
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>hzp sweep</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; font-size: 12px; }}
th, td {{ border: 1px solid #ccc; padding: 2px 6px; text-align: right; white-space: nowrap; }}
tr.failed td {{ background: #fdd; }}
tr.oom td {{ background: #eee; color: #777; }}
img {{ max-width: 100%; }}
th {{ cursor: pointer; background: #f4f4f4; }}
.extra {{ display: none; }}
body.all .extra {{ display: table-cell; }}
code {{ background: #f4f4f4; padding: 2px 4px; }}
</style></head><body>
<h1>hzp sweep</h1>
<p>Produced by <code>{esc(command)}</code> {esc(note)}</p>
<p>{len([r for r in rows if r is not None])} scenarios, {failed} failed, {oom} do not fit in GPU memory (grey, listed
after the runnable ones: their step time and MFU describe a run that cannot happen). Table:
<a href="results.csv">results.csv</a>. Memory in GiB (2<sup>30</sup> bytes), traffic in GB (10<sup>9</sup> bytes).
{esc(SHARDING_LEGEND)}.</p>
{images}
<p><label><input type="checkbox" onchange="document.body.classList.toggle('all', this.checked)"> all
{len(COLUMNS) + 1} columns</label> (click a header to sort)</p>
<table><tr>{head}</tr>
{chr(10).join(body)}
</table>
<script>{SORT_SCRIPT}</script>
</body></html>
"""


def write_slurm(args):
    """OUT/slurm/files.txt and OUT/slurm/sweep.sbatch: one array task per scenario, --jobs at a time."""
    folder = os.path.join(args.out, "slurm")
    os.makedirs(os.path.join(folder, "logs"), exist_ok=True)
    files = [os.path.abspath(f) for f in args.files]
    write_atomic(os.path.join(folder, "files.txt"), "".join(f + "\n" for f in files))
    me, out = os.path.abspath(__file__), os.path.abspath(args.out)
    lines = ["#!/bin/bash", f"#SBATCH --job-name=hzp-sweep", f"#SBATCH --array=0-{len(files) - 1}%{args.jobs}",
             "#SBATCH --ntasks=1", f"#SBATCH --output={folder}/logs/%a.out"]
    lines += [f"#SBATCH {option}" for option in args.sbatch]
    lines += ["# One scenario per task: OUT/rows/<task>.json; then: python3 tools/sweep.py --collect --out OUT",
              f"exec {shlex.quote(sys.executable)} {shlex.quote(me)} --task -1 --out {shlex.quote(out)} "
              f"--hzp {shlex.quote(os.path.abspath(args.hzp))}" + (" --keep-runs" if args.keep_runs else "")]
    script = os.path.join(folder, "sweep.sbatch")
    write_atomic(script, "\n".join(lines) + "\n")
    print(f"sweep: wrote {script} ({len(files)} tasks, {args.jobs} at a time); submit it with `sbatch {script}`, "
          f"then write the report with `python3 {shlex.quote(me)} --collect --out {shlex.quote(args.out)}`",
          file=sys.stderr)
    return 0


def run_task(args):
    """One job array task: scenario args.task into OUT/rows/<task>.json (written even when it failed)."""
    path = args.files[args.task]
    run_dir = run_dir_of(args.out, args.task, path) if args.keep_runs else None
    row = result_row(path, *simulate_one(args.hzp, path, run_dir))
    os.makedirs(os.path.join(args.out, "rows"), exist_ok=True)
    write_atomic(os.path.join(args.out, "rows", f"{args.task}.json"), json.dumps(row) + "\n")
    print(f"sweep: task {args.task} {row['scenario']}: {outcome(row)}", file=sys.stderr)
    return 1 if row["error"] else 0


def collected_rows(args):
    """The rows the job array's tasks wrote, in file order; a task that left none is a failed row."""
    rows = []
    for i, path in enumerate(args.files):
        try:
            row = json.loads(read_regular_file(os.path.join(args.out, "rows", f"{i}.json"), 64 << 20))
            if not isinstance(row, dict) or set(row) != set(COLUMNS):
                raise ValueError("not a row")
            rows.append(row)
        except (OSError, ValueError, RecursionError):
            rows.append(result_row(path, None, None, f"task {i} left no readable OUT/rows/{i}.json"))
    return rows


def write_report(args, plt, rows, start):
    """results.csv, the plots and index.html; returns the exit status (1 when a scenario failed)."""
    csv_path = os.path.join(args.out, "results.csv")
    write_atomic(csv_path, csv_text(rows))
    plots = make_plots(plt, rows, args.out, args.formats)
    command, note = command_line()
    write_atomic(os.path.join(args.out, "index.html"), index_html(rows, plots, command, note))
    failed = sum(1 for r in rows if r["error"])
    print(f"sweep: {len(rows)} scenarios ({failed} failed) in {time.monotonic() - start:.1f} s; wrote {csv_path}, "
          f"{', '.join(plots) or 'no plots'} and index.html", file=sys.stderr)
    return 1 if failed else 0


def command_line():
    """The command that produced this run, and where it ran from relative to the repository."""
    command = "python3 " + shlex.join(sys.argv)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    where = "from the repository root" if os.path.samefile(os.getcwd(), repo) else f"in {os.getcwd()}"
    stamp = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return command, f"(run {where}, {stamp})."


# ---------------------------------------------------------------------------------------------------------

def main(argv):
    try:
        args = parse_args(argv)
        plt = import_pyplot()
    except UsageError as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    start = time.monotonic()
    if args.slurm:
        return write_slurm(args)
    if args.task is not None:
        return run_task(args)
    if args.collect:
        return write_report(args, plt, collected_rows(args), start)
    csv_path = os.path.join(args.out, "results.csv")
    print(f"sweep: {len(args.files)} scenarios, {args.jobs} at a time, {args.hzp} -> {args.out}", file=sys.stderr)

    finished = [None] * len(args.files)

    def on_row(i, row):
        finished[i] = row
        write_atomic(csv_path, csv_text(finished))

    try:
        rows = run_sweep(args, on_row)
    except KeyboardInterrupt:
        done = sum(r is not None for r in finished)
        print(f"sweep: interrupted; {csv_path} holds the {done} scenarios finished", file=sys.stderr)
        return 130
    return write_report(args, plt, rows, start)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
