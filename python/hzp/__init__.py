"""hzp from Python: the scheduling core and the SimGrid simulator over the same C++ as the `hzp` command.

    import hzp
    sc = hzp.Scenario({"model": {"preset": "llama2-7b"}, "cluster": {"preset": "a800", "nodes": 32},
                       "training": {"seq_len": 4096, "micro_batch": 1, "global_batch_sequences": 1024},
                       "policy": {"preset": "zero3"}})
    sc = sc.with_overrides({"policy.preset": "asynchzp", "cluster.nodes": 128})
    est = hzp.estimate(sc)            # the analytic estimate (a dict)
    sim = hzp.simulate(sc, steps=1)   # summary.json of `hzp simulate` (a dict)
    plan = hzp.plan(sc)               # plan.json of `hzp plan`: every preset policy estimated
    best = hzp.plan(sc, search=True, top=4, jobs=2)["best_scenario"]   # `hzp plan --search`'s best.json
    many = hzp.simulate_many([sc, sc.set("policy.preset", "zero1")], jobs=2)
    rows = hzp.collective("dgx-h100", op="all_reduce", group="node", bytes=(8, 8 << 30))
    rep = hzp.replay("traces/tiny_dense_4ranks.json")   # hzp replay: a recorded trace re-run in SimGrid

A bad field raises hzp.ScenarioError (a ValueError) whose message names the JSON path and value, as the CLI's
exit 2 does; an internal error raises RuntimeError. Simulations run in child processes (SimGrid allows one
engine per process; a crash never takes the interpreter down) and release the GIL. Results are plain dicts
with the fields of the CLI's JSON outputs; hzp.to_pandas(rows) makes a DataFrame where pandas is installed.
"""
import concurrent.futures
import copy
import json
import os
import re
import sys

from . import _hzp

__all__ = ["Scenario", "ScenarioError", "load", "validate", "estimate", "plan", "simulate", "simulate_many",
           "calibrate", "collective", "replay", "import_trace", "write_trace", "to_pandas"]


class ScenarioError(ValueError):
    """A scenario or argument hzp refuses (the CLI's exit 2). `path` is the JSON path the message starts with,
    when it names one ("training.micro_batch"), else None."""

    def __init__(self, message):
        super().__init__(message)
        # A replay what-if's message names the overrides first: "--scenario (merged into ...): training.x: ...".
        match = re.match(r"(?:--scenario \([^)]*\): )?([A-Za-z_][\w.\[\]-]*): ", message)
        self.path = match.group(1) if match else None


def _call(fn, *args):
    code, text = fn(*args)
    if code == 0:
        return text
    if code == 2:
        raise ScenarioError(text)
    raise RuntimeError(text)


def _assignment(path, value):
    """`--set PATH=VALUE` for a Python value: JSON unless it is a plain string."""
    if not isinstance(path, str) or not path:
        raise ScenarioError(f"override path: expected a non-empty string, got {path!r}")
    text = value if isinstance(value, str) else json.dumps(value, allow_nan=False)
    return f"{path}={text}"


class Scenario:
    """A scenario: the document as written plus `--set` style overrides, resolved as `hzp validate` does on
    creation (an invalid one raises ScenarioError). `resolved` is the resolved form (a dict); `document`
    the written one with the overrides applied in order."""

    def __init__(self, document, overrides=None):
        if isinstance(document, Scenario):
            document = document.document
        if not isinstance(document, dict):
            raise ScenarioError(f"scenario: expected a dict (the JSON document), got {type(document).__name__}")
        try:
            self._text = json.dumps(document, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ScenarioError(f"scenario: not JSON-serialisable: {e}") from None
        self._document = copy.deepcopy(document)
        self._sets = [_assignment(p, v) for p, v in (overrides or {}).items()]
        self.resolved = json.loads(_call(_hzp.resolve, self._text, self._sets))

    @property
    def document(self):
        return copy.deepcopy(self._document)

    @property
    def name(self):
        return self.resolved.get("name")

    def with_overrides(self, overrides):
        """A new scenario with `{"path.to.field": value}` applied after this one's overrides."""
        if not isinstance(overrides, dict):
            raise ScenarioError(f"overrides: expected a dict of path -> value, got {type(overrides).__name__}")
        out = Scenario.__new__(Scenario)
        out._text, out._document = self._text, copy.deepcopy(self._document)
        out._sets = self._sets + [_assignment(p, v) for p, v in overrides.items()]
        out.resolved = json.loads(_call(_hzp.resolve, out._text, out._sets))
        return out

    def set(self, path, value):
        """with_overrides({path: value})."""
        return self.with_overrides({path: value})

    def to_json(self):
        """The resolved scenario as JSON text (what `hzp validate` prints; a file `hzp simulate` runs)."""
        return json.dumps(self.resolved, indent=2)

    def __repr__(self):
        return f"hzp.Scenario({self.name!r})"

    def _resolved_text(self):
        return json.dumps(self.resolved)


def load(path, overrides=None):
    """A scenario file (scenarios/README.md), with `{"path": value}` overrides."""
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except OSError as e:
        raise ScenarioError(f"{path}: {e.strerror}") from None
    except ValueError as e:
        raise ScenarioError(f"{path}: not JSON ({e})") from None
    if isinstance(document, dict) and "name" not in document:
        document["name"] = os.path.splitext(os.path.basename(path))[0]
    return Scenario(document, overrides)


def _scenario(sc):
    if isinstance(sc, Scenario):
        return sc
    if isinstance(sc, dict):
        return Scenario(sc)
    if isinstance(sc, (str, os.PathLike)):
        return load(sc)
    raise ScenarioError(f"scenario: expected an hzp.Scenario, a dict or a file path, got {type(sc).__name__}")


def validate(sc):
    """The resolved scenario (a dict), as `hzp validate` prints it; ScenarioError when it is not valid."""
    return _scenario(sc).resolved


def estimate(sc):
    """The analytic estimate (shared/estimate): step time, MFU, tokens/s, memory by category, traffic."""
    return json.loads(_call(_hzp.estimate, _scenario(sc)._resolved_text()))


def _command(name, args):
    """`hzp NAME ARGS` (every command but train) in a child process; ScenarioError / RuntimeError as it exits."""
    _call(_hzp.command, name, [str(a) for a in args])


def _read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write_scenario(sc, folder):
    path = os.path.join(folder, "scenario.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(_scenario(sc).to_json())
    return path


def _count(name, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ScenarioError(f"{name}: expected an integer in [{lo}, {hi}], got {value!r}")
    return value


def _budget_flags(max_sim_seconds, max_sim_gib):
    flags = []
    if max_sim_seconds is not None:
        flags += ["--max-sim-seconds", repr(float(_number("max_sim_seconds", max_sim_seconds, 0, 1e9)))]
    if max_sim_gib is not None:
        flags += ["--max-sim-GiB", repr(float(_number("max_sim_gib", max_sim_gib, 1e-3, 1e6)))]
    return flags


def plan(sc, search=False, top=8, jobs=None, exact=False, max_sim_seconds=None, max_sim_gib=None, out=None):
    """`hzp plan`'s plan.json: every preset policy estimated, the best that fits, what would fit otherwise.
    search=True is `hzp plan --search`: the AMSP sharding x prefetch x overlap and ND searches, the `top`
    best and every fitting preset simulated in SimGrid, `jobs` at a time (default: the cores); its plan.json,
    with "best_scenario" added: the fastest simulated candidate ("best") as an hzp.Scenario (best.json).
    `out` keeps the search's folder (each candidate's summary and timeline, as --out DIR); by default it is
    removed."""
    if not search:
        if out is not None:
            raise ScenarioError("out: only plan(search=True) writes a folder")
        return json.loads(_call(_hzp.plan, _scenario(sc)._resolved_text()))
    import tempfile
    args = ["--search", "--top", _count("top", top, 1, 10000)]
    if jobs is not None:
        args += ["--jobs", _count("jobs", jobs, 1, 4096)]
    args += (["--exact"] if exact else []) + _budget_flags(max_sim_seconds, max_sim_gib)
    with tempfile.TemporaryDirectory(prefix="hzp-plan-") as tmp:
        folder = os.path.join(tmp, "plan") if out is None else os.fspath(out)
        _command("plan", [_write_scenario(sc, tmp)] + args + ["--out", folder])
        result = _read_json(os.path.join(folder, "plan.json"))
        result["best_scenario"] = Scenario(_read_json(os.path.join(folder, "best.json")))
    return result


def _existing(name, path):
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise ScenarioError(f"{name}: {path!r} is not a file")
    return os.fspath(path)


def replay(trace, what_if=None, steps=None, max_sim_seconds=None, max_sim_gib=None):
    """`hzp replay TRACE`'s summary.json (with its "replay" object: recorded against replayed step per rank):
    the recorded schedule re-run in SimGrid with the recorded durations. what_if={"path": value, ...} (or a
    dict of scenario overrides under the same paths) is `hzp replay TRACE --set ...`: the schedule rebuilt
    for the changed scenario, compute at the recorded seconds per FLOP (summary.json's "what_if" object);
    `steps` simulates that many steps of a what-if."""
    import tempfile
    args = [_existing("trace", trace)]
    for path, value in (what_if or {}).items():
        args += ["--set", _assignment(path, value)]
    if steps is not None:
        if not what_if:
            raise ScenarioError("steps: only a what-if (what_if=...) simulates more steps than the trace recorded")
        args += ["--steps", _count("steps", steps, 1, 1000)]
    args += _budget_flags(max_sim_seconds, max_sim_gib)
    with tempfile.TemporaryDirectory(prefix="hzp-replay-") as tmp:
        out = os.path.join(tmp, "replay")
        _command("replay", args + ["--out", out, "--timeline-ranks", "1"])
        return _read_json(os.path.join(out, "summary.json"))


def import_trace(profiles, sc, include_idle=False, check=True):
    """`hzp import`: PyTorch profiler traces (one path, or a list: one per rank) of the run `sc` describes,
    as an hzp trace (format v1, a dict) that replay() takes once written to a file (hzp.write_trace)."""
    import tempfile
    if isinstance(profiles, (str, os.PathLike)):
        profiles = [profiles]
    args = [_existing("profiles", p) for p in profiles]
    if not args:
        raise ScenarioError("profiles: expected at least one profiler trace")
    with tempfile.TemporaryDirectory(prefix="hzp-import-") as tmp:
        out = os.path.join(tmp, "trace.json")
        args += ["--scenario", _write_scenario(sc, tmp), "--out", out]
        args += (["--include-idle"] if include_idle else []) + ([] if check else ["--no-check"])
        _command("import", args)
        return _read_json(out)


def write_trace(trace, path):
    """Writes a trace dict (import_trace's) to `path` as JSON, for replay() and calibrate(trace=...)."""
    if not isinstance(trace, dict):
        raise ScenarioError(f"trace: expected a trace dict, got {type(trace).__name__}")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)
    return path


def _number(name, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise ScenarioError(f"{name}: expected a number in [{lo}, {hi}], got {value!r}")
    return value


def simulate(sc, steps=1, exact=False, max_sim_seconds=None, max_sim_gib=None):
    """`hzp simulate`'s summary.json (with its breakdown) as a dict; no timeline is written. `exact` simulates
    every rank and micro-batch; max_sim_seconds / max_sim_gib are the CLI's budget flags (0 s: no limit)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 1000:
        raise ScenarioError(f"steps: expected an integer in [1, 1000], got {steps!r}")
    seconds = -1.0 if max_sim_seconds is None else float(_number("max_sim_seconds", max_sim_seconds, 0, 1e9))
    gib = -1.0 if max_sim_gib is None else float(_number("max_sim_gib", max_sim_gib, 1e-3, 1e6))
    return json.loads(_call(_hzp.simulate, _scenario(sc)._resolved_text(), steps, bool(exact), seconds, gib))


def calibrate(sc=None, tokens_per_gpu_s=None, step_time_s=None, mfu=None, trace=None):
    """`hzp calibrate SCENARIO --tokens-per-gpu-s X | --step-time-s X | --mfu X` (one measurement, taken on the
    scenario's one node): {"efficiency": the fitted {gemm, memory_bound, intra_node, inter_node},
    "table_efficiency", "measured_step_s", "table_step_s", "fitted_step_s", "exposed_comm_s", "scenario": an
    hzp.Scenario with the fitted efficiencies (what --out writes)}. calibrate(trace=PATH) is `hzp calibrate
    --trace PATH`: the trace's own scenario with cluster.efficiency fitted to every compute and optimizer op
    it recorded, {"scenario": that hzp.Scenario, "efficiency": its cluster.efficiency}."""
    if trace is not None:
        if sc is not None or any(v is not None for v in (tokens_per_gpu_s, step_time_s, mfu)):
            raise ScenarioError("calibrate: trace= takes no scenario or measurement (the trace holds both)")
        import tempfile
        with tempfile.TemporaryDirectory(prefix="hzp-calibrate-") as tmp:
            out = os.path.join(tmp, "calibrated.json")
            _command("calibrate", ["--trace", _existing("trace", trace), "--out", out])
            fitted = Scenario(_read_json(out))
        return {"scenario": fitted, "efficiency": fitted.resolved["cluster"]["efficiency"]}
    if sc is None:
        raise ScenarioError("calibrate: give a scenario and one measurement, or trace=")
    given = [(k, v) for k, v in [("tokens_per_gpu_s", tokens_per_gpu_s), ("step_time_s", step_time_s), ("mfu", mfu)]
             if v is not None]
    if len(given) != 1:
        raise ScenarioError("calibrate: give one measurement (tokens_per_gpu_s, step_time_s or mfu)")
    kind, value = given[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(f"{kind}: expected a number, got {value!r}")
    out = json.loads(_call(_hzp.calibrate, _scenario(sc)._resolved_text(), kind, float(value)))
    out["scenario"] = Scenario(out["scenario"])
    return out


def collective(cluster, op, group="all", bytes=(8, 1 << 30), nodes=None, algorithm=None, protocol=None,
               dtype=None, max_sim_seconds=None, max_sim_gib=None):
    """`hzp collective`'s simulated nccl-tests: `op` over `group` ("node", "all" or a GPU count) of `cluster` (a
    preset name, or a dict holding a cluster object) for sizes bytes[0], 2·bytes[0], ... <= bytes[1] (one int:
    that size alone). Returns its --json document: {cluster, gpu, nodes, gpus_per_node, op, group_gpus,
    group_nodes, rows: [{size_bytes, count, type, redop, root, time_us, algbw_GBps, busbw_GBps, model_us,
    algorithm, protocol}], avg_busbw_GBps}."""
    import tempfile
    if isinstance(bytes, int) and not isinstance(bytes, bool):
        bytes = (bytes, bytes)
    if not isinstance(bytes, (tuple, list)) or len(bytes) != 2 or not all(
            isinstance(b, int) and not isinstance(b, bool) for b in bytes):
        raise ScenarioError(f"bytes: expected an int or a (min, max) pair of ints, got {bytes!r}")
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(cluster, dict):
            path = os.path.join(tmp, "cluster.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(cluster, f)
            cluster = path
        if not isinstance(cluster, str):
            raise ScenarioError(f"cluster: expected a preset name or a cluster dict, got {type(cluster).__name__}")
        args = ["--cluster", cluster, "--op", str(op), "--group", str(group), "--bytes", f"{bytes[0]}:{bytes[1]}"]
        for flag, value in [("--nodes", nodes), ("--algorithm", algorithm), ("--protocol", protocol),
                            ("--dtype", dtype), ("--max-sim-seconds", max_sim_seconds),
                            ("--max-sim-GiB", max_sim_gib)]:
            if value is not None:
                args += [flag, str(value)]
        rows = os.path.join(tmp, "rows.json")
        _command("collective", args + ["--json", rows])
        return _read_json(rows)


class _Progress:
    """A progress line: tqdm's bar where tqdm is installed (notebooks too), else a line on stderr."""

    def __init__(self, total, enabled):
        self.total, self.done, self.bar = total, 0, None
        self.enabled = enabled and total > 0
        if self.enabled:
            try:
                from tqdm.auto import tqdm
                self.bar = tqdm(total=total, desc="hzp simulate")
            except ImportError:
                self.bar = None

    def step(self):
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            return
        filled = int(30 * self.done / self.total)
        sys.stderr.write(f"\rhzp simulate [{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    def close(self):
        if self.bar is not None:
            self.bar.close()


def simulate_many(scenarios, jobs=None, steps=1, exact=False, progress=True, errors="raise"):
    """Simulates each scenario (each in its own process, `jobs` at once; default: the CPU count) and returns
    their summaries in order. errors="raise" raises the first failure after all have run; errors="return"
    puts the exception in that scenario's place."""
    items = list(scenarios)  # each converted in its worker: a bad one fails in its place
    if jobs is None:
        jobs = os.cpu_count() or 1
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= 256:
        raise ScenarioError(f"jobs: expected an integer in [1, 256], got {jobs!r}")
    if errors not in ("raise", "return"):
        raise ScenarioError(f"errors: expected 'raise' or 'return', got {errors!r}")
    bar = _Progress(len(items), progress)
    results = [None] * len(items)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(simulate, s, steps, exact): i for i, s in enumerate(items)}
        for f in concurrent.futures.as_completed(futures):
            try:
                results[futures[f]] = f.result()
            except (ScenarioError, RuntimeError) as e:
                results[futures[f]] = e
            bar.step()
    bar.close()
    if errors == "raise":
        for r in results:
            if isinstance(r, Exception):
                raise r
    return results


def _flatten(row, prefix=""):
    out = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def to_pandas(rows):
    """A pandas DataFrame of result dicts (nested fields as "a.b" columns); pandas is optional."""
    try:
        import pandas
    except ImportError:
        raise ImportError("hzp.to_pandas needs pandas (apt install python3-pandas)") from None
    if isinstance(rows, dict):
        rows = [rows]
    return pandas.DataFrame([_flatten(r) for r in rows])
