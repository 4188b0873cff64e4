#!/usr/bin/env python3
"""The include rule: a folder includes only itself and the folders below it, so the include graph has no loop.

Each tree's folders are listed bottom-up in LAYERS; a file in layer i may include a project header from
layers 0..i of its own tree and from the trees listed in TREES_BELOW. A file directly in a tree's top folder
(e.g. runtime/runtime_info.h) sits above all of that tree's layers. A sub-folder not in the table is an error
(add it to the table, in its place, with the folder). Prints every violation as `file:line: why` and exits 1.

  python3 tools/check_layers.py [repo root]        # run by ctest as `include_layers`
  python3 tools/check_layers.py --self-test        # the rule catches a loop on a made-up tree
"""
import os
import re
import sys

# Bottom-up. A folder's sub-folders (e.g. shared/trace/import) belong to its layer.
LAYERS = {
    "shared": ["base", "policy", "scenario", "model", "ir", "schedule", "cost", "trace", "estimate", "compile",
               "calibrate", "plan"],
    "runtime": ["store", "device", "backends", "model", "train", "launch"],
    "sim": ["collectives"],
}
# Which other trees a tree may include (the core includes no executor; the executors do not include each other).
TREES_BELOW = {
    "shared": [],
    "runtime": ["shared"],
    "sim": ["shared"],
    "tools": ["shared", "runtime", "sim"],
}
# sim/collectives implements sim/collective.h, the one interface the simulator's top folder gives it.
EXCEPTIONS = {("sim/collectives", "sim/collective.h")}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE = (".h", ".cc", ".cu", ".cuh")


def layer_of(path):
    """(tree, rank) of a repo-relative path; rank len(LAYERS[tree]) = the tree's top folder."""
    parts = path.split("/")
    tree = parts[0]
    layers = LAYERS.get(tree, [])
    if len(parts) == 2:
        return tree, len(layers)
    if parts[1] not in layers:
        return tree, None
    return tree, layers.index(parts[1])


def check(root):
    errors = []
    for tree in TREES_BELOW:
        for folder, _, files in os.walk(os.path.join(root, tree)):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
                src_tree, src_rank = layer_of(path)
                if src_rank is None:
                    errors.append(f"{path}:1: folder {path.split('/')[1]}/ is not in {tree}'s LAYERS "
                                  "(tools/check_layers.py)")
                    continue
                with open(os.path.join(root, path), encoding="utf-8") as f:
                    for line_no, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or "/" not in m.group(1):
                            continue
                        target = m.group(1)
                        dst_tree, dst_rank = layer_of(target)
                        if dst_tree not in TREES_BELOW:
                            continue  # not a project header
                        src_folder = "/".join(path.split("/")[:2])
                        if (src_folder, target) in EXCEPTIONS:
                            continue
                        if dst_tree != src_tree:
                            if dst_tree not in TREES_BELOW[src_tree]:
                                errors.append(f"{path}:{line_no}: {src_tree}/ may not include {target}")
                        elif dst_rank is None or dst_rank > src_rank:
                            errors.append(f"{path}:{line_no}: {target} is above {src_folder}/ "
                                          f"(order: {' < '.join(LAYERS[src_tree])})")
    return errors


def self_test():
    import tempfile
    files = {
        "shared/base/a.h": '#include "shared/plan/p.h"\n',        # up: error
        "shared/plan/p.h": '#include "shared/base/a.h"\n',        # down: fine
        "shared/nowhere/x.h": "",                                 # folder not in the table: error
        "runtime/train/t.h": '#include "runtime/launch/l.h"\n',   # up: error
        "runtime/launch/l.h": '#include "sim/executor.h"\n',      # other executor: error
        "sim/collectives/c.cc": '#include "sim/collective.h"\n',  # the exception: fine
    }
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                f.write(text)
        errors = check(root)
    flagged = sorted(e.split(":")[0] for e in errors)
    expected = ["runtime/launch/l.h", "runtime/train/t.h", "shared/base/a.h", "shared/nowhere/x.h"]
    if flagged != expected:
        print("self-test failed: flagged", flagged, "expected", expected)
        return 1
    print("self-test passed")
    return 0


def main():
    if "-h" in sys.argv[1:] or "--help" in sys.argv[1:]:
        print(__doc__.strip())
        return 0
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and (sys.argv[1].startswith("-") or not os.path.isdir(sys.argv[1]))):
        print(f"check_layers: expected [ROOT] (a folder) or --self-test, got {' '.join(sys.argv[1:])[:80]}",
              file=sys.stderr)
        return 2
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    errors = check(root)
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} include(s) break the layer rule", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
