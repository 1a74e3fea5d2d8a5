#!/usr/bin/env python3
"""Runs every compile command of a CMake build (compile_commands.json) with
-fsyntax-only instead of compiling: the front end's diagnostics, clang's
-Wthread-safety analysis among them, without code generation or linking.
Fails, after all files are checked, if any file has an error; prints each
failing file's diagnostics.

Usage: syntax-check.py COMPILE_COMMANDS.json [--skip REGEX] [--only REGEX]
                       [--jobs N]
"""

import argparse
import concurrent.futures
import json
import re
import shlex
import subprocess
import sys


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


def check(entry):
    args = syntax_only(entry["command"])
    result = subprocess.run(args, cwd=entry["directory"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return entry["file"], result.returncode, result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("compile_commands")
    parser.add_argument("--skip", default="", help="leave out files whose path matches")
    parser.add_argument("--only", default="", help="check only files whose path matches")
    parser.add_argument("--jobs", type=int, default=2)
    options = parser.parse_args()

    with open(options.compile_commands) as f:
        entries = json.load(f)
    chosen = [e for e in entries
              if not (options.skip and re.search(options.skip, e["file"]))
              and (not options.only or re.search(options.only, e["file"]))]
    if not chosen:
        sys.exit(f"syntax-check: no file of {options.compile_commands} is chosen")
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
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
