#!/usr/bin/env python3
"""Fails on an include that goes up or sideways between the project's rooms.

Each room (a folder) may include from itself and from the rooms listed
below it in LAYERS, nothing else: the arrows of the include graph all point
one way, so no room can grow a cycle through another. A folder named
`internal` is private to the room it sits in; `testing` folders serve tests
(`*_test.cc`, tests/, bench/, fuzz targets) and other testing folders only,
and the tests of any room may include the process and cluster kit in the
top-level testing/.

    scripts/check_layers.py [REPO]     # prints each violation, exits 1 if any

Only includes in quotes that name a file of the tree are checked (system,
generated and third-party headers are not rooms).
"""

import os
import re
import sys

# room -> the rooms it may include from (besides itself). Longest prefix
# wins, so server/replication is part of server unless listed.
LAYERS = {
    "proto": [],
    "common": ["proto"],
    "wire": ["common", "proto"],
    "etcd": ["common", "proto"],
    "chain": ["etcd", "common", "proto"],
    # Sparse embedding tables' rows: no RPC, no proto.
    "sparse": [],
    # What binaries' main files link: flags, process set-up (such as the
    # bound of the wire's buffer pool).
    "app": ["wire", "common"],
    "server": ["chain", "etcd", "wire", "sparse", "common", "proto", "app"],
    "client": ["chain", "etcd", "wire", "sparse", "common", "proto"],
    "worker": ["client", "chain", "wire", "common", "proto", "app"],
    "ctl": ["client", "chain", "etcd", "wire", "common", "proto", "app"],
    "python": ["worker", "client", "wire", "common", "proto", "app"],
    "examples": [],
    # The process and cluster kit of tests and benchmarks (any room's tests
    # may include it: see violation()).
    "testing": ["chain", "etcd", "common", "proto"],
    # Binaries' drivers of everything: any room's public headers.
    "bench": ["*"],
    "tests": ["*"],
}
SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def room_of(path):
    best = None
    for room in LAYERS:
        if (path == room or path.startswith(room + "/")) and (best is None or len(room) > len(best)):
            best = room
    return best


def is_test(path):
    return (path.endswith("_test.cc") or path.startswith(("tests/", "bench/", "testing/"))
            or "/testing/" in path or "/fuzz/" in path)


def violation(path, included):
    """Why `path` may not include `included`, or None."""
    here, there = room_of(path), room_of(included)
    if here is None or there is None:
        return None
    parts = included.split("/")
    if "internal" in parts:
        owner = "/".join(parts[:parts.index("internal")])
        if not (path.startswith(owner + "/")):
            return f"{included} is internal to {owner}/"
    if "testing" in parts and not is_test(path):
        return f"{included} serves tests only"
    if here == there:
        return None
    if there == "testing" and is_test(path):
        return None  # every room's tests run processes with the kit
    allowed = LAYERS[here]
    if "*" in allowed or there in allowed:
        return None
    return f"{here}/ may include from {', '.join(r + '/' for r in allowed) or 'no other room'}, not {there}/"


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    found = []
    for room in LAYERS:
        top = os.path.join(repo, room)
        if "/" in room or not os.path.isdir(top):
            continue
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "node_modules"]
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                full = os.path.join(folder, name)
                path = os.path.relpath(full, repo)
                with open(full, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for match in INCLUDE.finditer(text):
                    included = match.group(1)
                    if not os.path.isfile(os.path.join(repo, included)):
                        continue
                    why = violation(path, included)
                    if why:
                        line = text.count("\n", 0, match.start()) + 1
                        found.append(f"{path}:{line}: includes {included}: {why}")
    for item in found:
        print(item)
    print(f"{len(found)} layering violation(s)" if found else "layers: every include points down")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
