#!/usr/bin/env python3
"""Runs every compile command of a CMake build (compile_commands.json) with
-fsyntax-only instead of compiling: the front end's diagnostics, clang's
-Wthread-safety analysis among them, without code generation or linking.
Fails, after all files are checked, if any file has an error; prints each
failing file's diagnostics.

Files that share their flags are parsed after a precompiled header of the
libraries' headers they include (gRPC, protobuf and the generated
messages, Abseil, glog, prometheus-cpp, GoogleTest in tests): most of a
file's parse is those headers, so each is parsed once per flag set, not
once per file. The project's own headers are still parsed with each file,
so the analysis of their code is unchanged; a file that fails with the
precompiled header is parsed again without it, and only that parse counts.

--lock-free-tests leaves out the tests' own sources (*_test.cc, tests/)
that name no mutex, lock annotation or lock: -Wthread-safety reports only
on code that takes or releases a capability, touches data guarded by one
or calls a function annotated with one, and a test file cannot do any of
that without naming it (a library's lock-requiring functions need its
private mutex). Nine test files in ten name none, a third of the check.

Usage: syntax-check.py COMPILE_COMMANDS.json [--skip REGEX] [--only REGEX]
                       [--lock-free-tests] [--jobs N] [--pch-dir DIR]
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys

# The libraries' headers in a precompiled header, each where the flag set's
# include paths find it.
PCH_HEADERS = [
    "<algorithm>", "<atomic>", "<functional>", "<map>", "<memory>", "<mutex>",
    "<string>", "<thread>", "<vector>",
    "<glog/logging.h>",
    "<grpcpp/grpcpp.h>", "<grpcpp/generic/generic_stub.h>",
    "<google/protobuf/message.h>",
    '"proto/shardtrain.pb.h"', '"proto/shardtrain.grpc.pb.h"',
    "<prometheus/registry.h>", "<prometheus/counter.h>", "<prometheus/gauge.h>",
    "<prometheus/histogram.h>",
    '"absl/container/flat_hash_map.h"', '"absl/flags/flag.h"', '"absl/status/statusor.h"',
    '"absl/strings/str_cat.h"', '"absl/strings/str_format.h"',
    '"absl/synchronization/mutex.h"', '"absl/time/clock.h"', '"absl/time/time.h"',
]
# Only where the flags say GoogleTest (its targets define GTEST_HAS_PTHREAD).
PCH_TEST_HEADERS = ["<gtest/gtest.h>", "<gmock/gmock.h>"]
# What a test source must name for the lock analysis to have anything to
# check in it (see --lock-free-tests).
LOCK_WORDS = re.compile(r"Mutex|CondVar|ABSL_[A-Z_]*(LOCK|GUARDED|CAPABILITY)|"
                        r"std::(mutex|lock_guard|unique_lock|scoped_lock)")
TEST_SOURCE = re.compile(r"(_test\.cc$|(^|/)tests/)")
# Flag sets of fewer files are parsed without a precompiled header.
PCH_MIN_FILES = 5


def syntax_only(command):
    """The compile command's arguments with `-c` and `-o FILE` replaced by
    -fsyntax-only."""
    args = shlex.split(command)
    out = []
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
        elif arg == "-o":
            skip_next = True
        elif arg == "-c" or arg.startswith("-o"):
            continue
        else:
            out.append(arg)
    return out + ["-fsyntax-only"]


def flag_set(args):
    """What a precompiled header must share with the files that use it: the
    compiler and its flags, less include paths, the source file and the
    project's own macros (the libraries' headers do not read them)."""
    key = []
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
        elif arg in ("-I", "-isystem", "-iquote"):
            skip_next = True
        elif arg.startswith(("-I", "-isystem", "-iquote", "-DSHARDTRAIN_")):
            continue
        elif arg.endswith((".cc", ".cpp", ".cxx")):
            continue
        else:
            key.append(arg)
    return tuple(key)


def include_paths(args):
    """The include path flags of `args`, in order."""
    paths = []
    for i, arg in enumerate(args):
        if arg in ("-I", "-isystem", "-iquote") and i + 1 < len(args):
            paths += [arg, args[i + 1]]
        elif arg.startswith(("-I", "-isystem", "-iquote")):
            paths.append(arg)
    return paths


def build_pch(key, entries, pch_dir):
    """Builds the precompiled header of the files `entries` (flag set `key`);
    returns its path, or None (and why) if it does not build."""
    name = hashlib.sha1("\0".join(key).encode()).hexdigest()[:12]
    header = os.path.join(pch_dir, name + ".h")
    pch = header + ".pch"
    headers = PCH_HEADERS + (PCH_TEST_HEADERS if "-DGTEST_HAS_PTHREAD=1" in key else [])
    with open(header, "w") as f:
        for h in headers:
            f.write(f"#if __has_include({h})\n#include {h}\n#endif\n")
    paths = []
    for entry in entries:
        for p in include_paths(entry["args"]):
            if p not in paths:
                paths.append(p)
    # The union of the files' include paths (CMake writes them absolute).
    args = [a for a in key if a != "-fsyntax-only"] + [*paths, "-x", "c++-header", header,
                                                       "-o", pch]
    result = subprocess.run(args, cwd=entries[0]["directory"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        return None, result.stdout
    return pch, ""


def check(entry):
    args = entry["args"]
    if entry.get("pch"):
        result = subprocess.run(args + ["-include-pch", entry["pch"]], cwd=entry["directory"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if result.returncode == 0:
            return entry["file"], result.returncode, result.stdout
    result = subprocess.run(args, cwd=entry["directory"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return entry["file"], result.returncode, result.stdout


def names_a_lock(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return LOCK_WORDS.search(f.read()) is not None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("compile_commands")
    parser.add_argument("--skip", default="", help="leave out files whose path matches")
    parser.add_argument("--only", default="", help="check only files whose path matches")
    parser.add_argument("--lock-free-tests", action="store_true",
                        help="leave out test sources that name no lock (see above)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--pch-dir", default="",
                        help="where the precompiled headers go (none without it)")
    options = parser.parse_args()

    with open(options.compile_commands) as f:
        entries = json.load(f)
    chosen = [e for e in entries
              if not (options.skip and re.search(options.skip, e["file"]))
              and (not options.only or re.search(options.only, e["file"]))]
    if options.lock_free_tests:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        chosen = [e for e in chosen
                  if not TEST_SOURCE.search(os.path.relpath(e["file"], root))
                  or names_a_lock(e["file"])]
    if not chosen:
        sys.exit(f"syntax-check: no file of {options.compile_commands} is chosen")
    for entry in chosen:
        entry["args"] = syntax_only(entry["command"])
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        if options.pch_dir:
            os.makedirs(options.pch_dir, exist_ok=True)
            sets = {}
            for entry in chosen:
                sets.setdefault(flag_set(entry["args"]), []).append(entry)
            sets = {k: v for k, v in sets.items() if len(v) >= PCH_MIN_FILES}
            built = pool.map(lambda item: build_pch(item[0], item[1], options.pch_dir),
                             sets.items())
            for (key, entries), (pch, why) in zip(sets.items(), built):
                if pch is None:
                    print(f"syntax-check: no precompiled header for {len(entries)} files "
                          f"(parsed without):\n{why}", flush=True)
                for entry in entries:
                    entry["pch"] = pch
        for done, (path, code, output) in enumerate(pool.map(check, chosen), 1):
            print(f"[{done}/{len(chosen)}] {path}", flush=True)
            if code != 0 or output.strip():
                print(output, end="", flush=True)
            if code != 0:
                failed.append(path)
    if failed:
        print(f"syntax-check: {len(failed)} file(s) failed:", *failed, sep="\n  ",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
