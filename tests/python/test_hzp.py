"""The hzp Python module against the hzp command on the same scenarios: the same resolved scenario, plan.json
and summary.json (every field but the wall-clock ones), the same errors as ScenarioError (a ValueError) with
their JSON path. Runs under pytest, or as a plain script (`python3 tests/python/test_hzp.py`), with
PYTHONPATH=build/python and HZP_BINARY=build/hzp (what tests/CMakeLists.txt sets)."""
import json
import os
import subprocess
import sys
import tempfile

import hzp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HZP = os.environ.get("HZP_BINARY", os.path.join(ROOT, "build", "hzp"))
# Fields that say how long the simulator ran, or what it recorded for a timeline the module does not write.
WALL_CLOCK = {"sim_wall_s", "events_per_s", "sim_estimated_wall_s", "sim_estimated_resident_bytes", "timeline_ranks"}


def cli(*args):
    done = subprocess.run([HZP, *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done


def cli_summary(path, *sets):
    with tempfile.TemporaryDirectory() as out:
        flags = [a for s in sets for a in ("--set", s)]
        cli("simulate", path, "--out", out, "--timeline-ranks", "1", *flags)
        with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
            return json.load(f)


def same_summary(mine, theirs):
    for key in set(mine) | set(theirs):
        if key in WALL_CLOCK:
            continue
        assert key in mine and key in theirs, key
        assert mine[key] == theirs[key], (key, mine[key], theirs[key])


def test_bad_fields_raise_scenario_error_with_their_path():
    doc = {"model": {"preset": "llama2-7b"}, "cluster": {"preset": "a800", "nodes": 2},
           "training": {"seq_len": 4096, "micro_batch": 0}, "policy": {"preset": "zero3"}}
    try:
        hzp.Scenario(doc)
        raise AssertionError("micro_batch 0 was accepted")
    except hzp.ScenarioError as e:
        assert isinstance(e, ValueError)
        assert e.path == "training.micro_batch"
        assert "got 0" in str(e)
    good = hzp.load(os.path.join(ROOT, "scenarios", "default.json"))
    for path, value, named in [("policy.preset", "zero9", "policy.preset"), ("cluster.nodes", -1, "cluster.nodes"),
                               ("training.seq_len", "long", "training.seq_len")]:
        try:
            good.set(path, value)
            raise AssertionError(f"{path}={value!r} was accepted")
        except hzp.ScenarioError as e:
            assert e.path == named, (e.path, str(e))
    for bad in [42, {"model": float("nan")}, "no/such/file.json"]:
        try:
            hzp.validate(bad)
            raise AssertionError(f"{bad!r} was accepted")
        except hzp.ScenarioError:
            pass
    try:
        hzp.simulate(good, steps=0)
        raise AssertionError("steps 0 was accepted")
    except hzp.ScenarioError as e:
        assert e.path == "steps"


def test_overrides_resolve_as_the_cli_set_does():
    path = os.path.join(ROOT, "scenarios", "default.json")
    sc = hzp.load(path).with_overrides({"policy.preset": "hsdp", "cluster.nodes": 8})
    resolved = json.loads(cli("validate", path, "--set", "policy.preset=hsdp", "--set", "cluster.nodes=8").stdout)
    assert sc.resolved == resolved
    assert hzp.load(path).set("cluster.nodes", 8).set("policy.preset", "hsdp").resolved == resolved


def test_plan_is_the_cli_plan_json():
    path = os.path.join(ROOT, "scenarios", "default.json")
    with tempfile.TemporaryDirectory() as out:
        cli("plan", path, "--out", out)
        with open(os.path.join(out, "plan.json"), encoding="utf-8") as f:
            assert hzp.plan(hzp.load(path)) == json.load(f)


def test_estimate_is_the_plans_estimate_of_its_policy():
    sc = hzp.load(os.path.join(ROOT, "scenarios", "default.json"))
    est = hzp.estimate(sc)
    row = [c for c in hzp.plan(sc)["candidates"] if c["policy"] == sc.resolved["policy"]["preset"]][0]
    assert est["step_time_s"] == row["estimated_step_time_s"]
    assert est["peak_memory_bytes"] == row["memory_bytes_per_gpu"]["total"]
    assert est["comm_bytes"]["per_gpu"] == row["comm_bytes_per_gpu"]


def test_simulate_is_the_cli_summary():
    # The default scenario, and an interleaved pipeline whose steady state is counted (32 micro-batches).
    cases = [(os.path.join(ROOT, "scenarios", "default.json"), []),
             (os.path.join(ROOT, "tests", "data", "sim", "tp2-pp2x2.json"), ["training.global_batch_sequences=256"])]
    for path, sets in cases:
        sc = hzp.load(path).with_overrides({s.split("=")[0]: json.loads(s.split("=")[1]) for s in sets})
        mine = hzp.simulate(sc)
        same_summary(mine, cli_summary(path, *sets))
    assert mine["steady_state"]["simulated"] == [4, 6]
    exact = hzp.simulate(sc, exact=True)
    assert exact["steady_state"] is None and not exact["symmetric"]
    assert abs(exact["step_time_s"] - mine["step_time_s"]) <= 0.01 * exact["step_time_s"]


def test_a_simulation_past_its_budget_is_refused_not_run():
    sc = hzp.load(os.path.join(ROOT, "scenarios", "papers", "grok1-like-1024.json"))
    try:
        hzp.simulate(sc, max_sim_seconds=0.01)
        raise AssertionError("a 10 ms budget ran the Grok-1-like recipe")
    except hzp.ScenarioError as e:
        assert "--max-sim-seconds raises it" in str(e)


def test_simulate_many_keeps_the_order_and_reports_failures_in_place():
    sc = hzp.load(os.path.join(ROOT, "scenarios", "default.json"))
    scenarios = [sc, sc.set("policy.preset", "zero1"), sc.set("cluster.nodes", 2)]
    many = hzp.simulate_many(scenarios, jobs=2, progress=False)
    for s, result in zip(scenarios, many):
        assert result == {**hzp.simulate(s), **{k: result[k] for k in WALL_CLOCK if k in result}}
    mixed = hzp.simulate_many([sc, {"model": {"preset": "nope"}}], jobs=2, progress=False, errors="return")
    assert isinstance(mixed[1], hzp.ScenarioError) and mixed[0]["step_time_s"] > 0


def test_calibrate_is_the_cli_calibration():
    path = os.path.join(ROOT, "scenarios", "default.json")
    one_node = hzp.load(path, {"cluster.nodes": 1})
    fit = hzp.calibrate(one_node, tokens_per_gpu_s=3000)
    with tempfile.TemporaryDirectory() as out:
        written = os.path.join(out, "calibrated.json")
        cli("calibrate", path, "--set", "cluster.nodes=1", "--tokens-per-gpu-s", "3000", "--out", written)
        with open(written, encoding="utf-8") as f:
            assert fit["scenario"].resolved == json.load(f)
    assert abs(fit["fitted_step_s"] - fit["measured_step_s"]) <= 1e-9 * fit["measured_step_s"]
    assert abs(hzp.estimate(fit["scenario"])["tokens_per_gpu_per_s"] - 3000) <= 1e-6 * 3000
    for bad in [dict(), dict(mfu=0.5, step_time_s=1.0), dict(mfu=1.5), dict(mfu="high")]:
        try:
            hzp.calibrate(one_node, **bad)
            raise AssertionError(f"{bad} was accepted")
        except hzp.ScenarioError:
            pass


def test_collective_is_the_cli_json():
    with tempfile.TemporaryDirectory() as out:
        path = os.path.join(out, "rows.json")
        cli("collective", "--cluster", "dgx-h100", "--op", "all_reduce", "--group", "all", "--nodes", "4",
            "--bytes", "1K:64M", "--json", path)
        with open(path, encoding="utf-8") as f:
            theirs = json.load(f)
    mine = hzp.collective("dgx-h100", op="all_reduce", group="all", nodes=4, bytes=(1024, 64 << 20))
    assert mine == theirs and len(mine["rows"]) == 17
    for bad, named in [(dict(op="all_sum"), "--op"), (dict(op="all_reduce", bytes=(0, 8)), "--bytes")]:
        try:
            hzp.collective("dgx-h100", **bad)
            raise AssertionError(f"{bad} was accepted")
        except hzp.ScenarioError as e:
            assert str(e).startswith(named), str(e)
    try:
        hzp.collective("no-such-cluster", op="all_reduce")
        raise AssertionError("an unknown preset was accepted")
    except hzp.ScenarioError as e:
        assert e.path == "cluster.preset"


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_plan_search_is_the_cli_plan_search():
    path = os.path.join(ROOT, "scenarios", "default.json")

    def comparable(plan):  # without the wall-clock fields and each candidate's folder (a path of its run)
        plan = dict(plan, search={k: v for k, v in plan["search"].items() if not k.endswith("_s")})
        plan["candidates"] = [{k: v for k, v in c.items() if k != "folder"} for c in plan["candidates"]]
        return plan

    with tempfile.TemporaryDirectory() as out:
        cli("plan", path, "--search", "--top", "2", "--jobs", "2", "--out", out)
        theirs, best = read_json(os.path.join(out, "plan.json")), read_json(os.path.join(out, "best.json"))
    mine = hzp.plan(hzp.load(path), search=True, top=2, jobs=2)
    assert mine.pop("best_scenario").resolved == hzp.Scenario(best).resolved
    assert comparable(mine) == comparable(theirs)
    assert len(mine["candidates"]) >= 3 and all(c["simulated_step_time_s"] > 0 for c in mine["candidates"])
    with tempfile.TemporaryDirectory() as out:  # out= keeps the folder, as --out does
        hzp.plan(hzp.load(path), search=True, top=1, jobs=2, out=out)
        assert os.path.isfile(os.path.join(out, "plan.json")) and os.path.isfile(os.path.join(out, "best.json"))
    for bad in [dict(top=0), dict(jobs=1.5), dict(max_sim_seconds=-1)]:
        try:
            hzp.plan(hzp.load(path), search=True, **bad)
            raise AssertionError(f"{bad} was accepted")
        except hzp.ScenarioError:
            pass


def test_replay_is_the_cli_replay():
    trace = os.path.join(ROOT, "traces", "tiny_dense_4ranks.json")
    for sets in [[], ["training.micro_batch=2"]]:
        with tempfile.TemporaryDirectory() as out:
            cli("replay", trace, *[a for s in sets for a in ("--set", s)], "--out", out, "--timeline-ranks", "1")
            theirs = read_json(os.path.join(out, "summary.json"))
        mine = hzp.replay(trace, what_if={s.split("=")[0]: json.loads(s.split("=")[1]) for s in sets})
        same_summary(mine, theirs)
        assert ("what_if" in mine) == bool(sets)
    try:
        hzp.replay(trace, what_if={"training.micro_batch": 0})
        raise AssertionError("micro_batch 0 was accepted")
    except hzp.ScenarioError as e:
        assert e.path == "training.micro_batch", str(e)
    for bad in [dict(steps=2), dict(what_if={"training.micro_batch": 2}, steps=0)]:
        try:
            hzp.replay(trace, **bad)
            raise AssertionError(f"{bad} was accepted")
        except hzp.ScenarioError:
            pass
    try:
        hzp.replay(os.path.join(ROOT, "no-such-trace.json"))
        raise AssertionError("a missing trace was accepted")
    except hzp.ScenarioError as e:
        assert e.path == "trace"


def test_import_and_calibrate_from_a_trace_are_the_cli_ones():
    # The 134 M model's PyTorch profile recorded on an H100 (traces/kineto/), imported, then calibrated.
    profile = os.path.join(ROOT, "traces", "kineto", "kineto_llama134m_b16_t1024.json.gz")
    scenario = os.path.join(ROOT, "scenarios", "kineto", "llama134m-h100.json")
    with tempfile.TemporaryDirectory() as out:
        written, fitted = os.path.join(out, "trace.json"), os.path.join(out, "fitted.json")
        cli("import", profile, "--scenario", scenario, "--out", written)
        cli("calibrate", "--trace", written, "--out", fitted)
        trace = hzp.import_trace(profile, hzp.load(scenario))
        assert trace == read_json(written)
        mine = hzp.calibrate(trace=hzp.write_trace(trace, os.path.join(out, "mine.json")))
        assert mine["scenario"].resolved == read_json(fitted)
        assert mine["efficiency"] == read_json(fitted)["cluster"]["efficiency"]
    try:  # a profile of another model is refused, with the CLI's message
        hzp.import_trace(profile, hzp.load(scenario, {"training.seq_len": 1024000}))
        raise AssertionError("a scenario faster than the GPU's peak was accepted")
    except hzp.ScenarioError:
        pass
    for bad in [dict(trace=profile, mfu=0.5), dict()]:
        try:
            hzp.calibrate(**bad)
            raise AssertionError(f"{bad} was accepted")
        except hzp.ScenarioError:
            pass


def test_the_documented_examples_run():
    # docs/python.md's code block and the package docstring's, as a reader would paste them.
    import re
    with open(os.path.join(ROOT, "docs", "python.md"), encoding="utf-8") as f:
        block = re.search(r"```python\n(.*?)```", f.read(), re.S).group(1)
    docstring = re.search(r"    import hzp\n(.*?)\n\n", hzp.__doc__, re.S).group(1)
    for code in [block, "\n".join(line[4:] for line in docstring.splitlines())]:
        try:
            import pandas  # noqa: F401
        except ImportError:
            code = code.replace("df = hzp.to_pandas(many)", "df = None")
        names = {}
        old = os.getcwd()
        os.chdir(ROOT)  # the examples name scenarios/ from the repository root
        try:
            exec("import hzp\n" + code, names)  # noqa: S102 - the docs' own example
        finally:
            os.chdir(old)
        assert names["sim"]["step_time_s"] > 0 and len(names["many"]) == 2


def test_the_sweep_example_runs():
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, os.path.join(ROOT, "docs", "examples", "sweep_nodes_policy.py"),
                               "--out", out], capture_output=True, text=True, check=False,
                              env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(hzp.__file__))})
        assert done.returncode == 0, done.stderr
        assert "pick at 32 nodes:" in done.stdout


def test_to_pandas_flattens_the_results():
    try:
        import pandas  # noqa: F401
    except ImportError:
        return  # pandas is optional
    df = hzp.to_pandas([hzp.estimate(hzp.load(os.path.join(ROOT, "scenarios", "default.json")))])
    assert "comm_bytes.per_gpu" in df.columns and len(df) == 1


if __name__ == "__main__":
    failed = 0
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"ok   {name}")
            except Exception as e:  # noqa: BLE001 - the plain runner reports every failure
                failed += 1
                print(f"FAIL {name}: {type(e).__name__}: {e}")
    sys.exit(1 if failed else 0)
