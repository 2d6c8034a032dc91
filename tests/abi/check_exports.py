#!/usr/bin/env python3
"""libtessel exports exactly the functions its public headers declare with TSL_API.

Usage: check_exports.py NM LIBRARY INCLUDE_DIR

Compares the library's defined dynamic symbols (nm -D --defined-only) with the function
declarations in INCLUDE_DIR/tessel/*.h and fails listing: symbols exported but not declared
(internal functions or data that leak), declared functions not exported, and declarations
without TSL_API.
"""
import glob
import os
import re
import subprocess
import sys

FUNCTION_TYPES = set("TWi")  # text, weak, indirect function


def declarations(include_dir):
    """{name: has TSL_API} of the function declarations in the public headers."""
    found = {}
    for path in sorted(glob.glob(os.path.join(include_dir, "tessel", "*.h"))):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"//[^\n]*", " ", text)
        text = re.sub(r"^\s*#[^\n]*(\\\n[^\n]*)*", " ", text, flags=re.M)
        for statement in re.split(r"[;{}]", text):
            statement = " ".join(statement.split())
            if statement.startswith("typedef") or statement.startswith("extern \"C\""):
                continue
            m = re.match(r"^(TSL_API\s+)?[\w\s\*]*?\b(tsl_\w+)\s*\(", statement)
            if m:
                found[m.group(2)] = m.group(1) is not None
    return found


def exports(nm, library):
    """(functions, other symbols) the library defines in its dynamic symbol table."""
    out = subprocess.run([nm, "-D", "--defined-only", library], check=True,
                         capture_output=True, text=True).stdout
    functions, others = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        kind, name = fields[-2], fields[-1].split("@")[0]
        (functions if kind in FUNCTION_TYPES else others).add(name)
    return functions, others


def main():
    nm, library, include_dir = sys.argv[1:4]
    declared = declarations(include_dir)
    functions, others = exports(nm, library)
    problems = [
        ("exported but not declared in include/tessel", sorted(functions - set(declared))),
        ("exported data or other non-function symbols", sorted(others)),
        ("declared but not exported", sorted(set(declared) - functions)),
        ("declared without TSL_API", sorted(n for n, marked in declared.items() if not marked)),
    ]
    failed = False
    for title, names in problems:
        if names:
            failed = True
            print("%s (%d):" % (title, len(names)))
            for name in names:
                print("  " + name)
    if len(declared) == 0:
        failed = True
        print("no declarations found under %s" % include_dir)
    print("%d public functions declared, %d functions exported" % (len(declared), len(functions)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
