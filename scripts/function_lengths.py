#!/usr/bin/env python3
"""Lists the functions longer than a limit (default 120 lines) in kiln's C++
and CUDA sources (src/, include/, tools/ unless paths are given) and exits 1
when there is one: the test suite runs it (CTest `function-lengths`).

A function is a definition whose body opens with a `{` ending a line that
is not inside another body (namespace and class bodies are looked into),
and ends at its matching `}`; lambdas and local classes count toward the
function that holds them. This fits the tree's clang-format style; it is not
a C++ parser.

    python3 scripts/function_lengths.py [--limit N] [PATH...]
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCOPES = re.compile(r"^\s*((template\s*<.*>\s*)?(class|struct|union|enum|namespace)\b|extern \"C\")")


def strip(line, in_comment):
    """The line without comments and string or character literals."""
    out, i = [], 0
    while i < len(line):
        if in_comment:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out), True
            i, in_comment = end + 2, False
        elif line.startswith("//", i):
            break
        elif line.startswith("/*", i):
            in_comment, i = True, i + 2
        elif line[i] in "\"'":
            q, i = line[i], i + 1
            while i < len(line) and line[i] != q:
                i += 2 if line[i] == "\\" else 1
            i += 1
        else:
            out.append(line[i])
            i += 1
    return "".join(out), in_comment


def functions(path):
    """(name, first line, length) of each function body in the file."""
    lines = path.read_text(errors="replace").splitlines()
    in_comment, stack, found, pending, since = False, [], [], "", 0
    # stack: one entry per open brace: (kind, line, name), kind "scope" (a
    # namespace, class or initializer), "function", or "block" (in a function)
    for n, raw in enumerate(lines, 1):
        code, in_comment = strip(raw, in_comment)
        if code.lstrip().startswith("#"):
            continue
        for ch in code + " ":
            in_function = any(kind == "function" for kind, _, _ in stack)
            if ch == "{":
                if in_function:
                    stack.append(("block", n, ""))
                    continue
                if pending.count("(") > pending.count(")"):  # a default argument's braces
                    stack.append(("init", n, ""))
                    pending += ch
                    continue
                head = pending.strip()
                is_function = not SCOPES.match(head) and re.search(
                    r"\)\s*(const|noexcept|override|final|->[^;]*|:[^;]*)?\s*$", head) is not None
                name = re.findall(r"([\w:~<>]+)\s*\(", head)
                stack.append(("function" if is_function else "scope", since or n,
                              name[0] if name else "?"))
                pending, since = "", 0
            elif ch == "}" and stack:
                kind, start, name = stack.pop()
                if kind == "function":
                    found.append((name, start, n - start + 1))
                if kind != "init":
                    pending, since = "", 0
                else:
                    pending += ch
            elif ch == ";" and not in_function:
                pending, since = "", 0
            elif not in_function:
                pending += ch
                if not since and not ch.isspace():
                    since = n
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=120)
    ap.add_argument("paths", nargs="*")
    args = ap.parse_args()
    roots = [pathlib.Path(p) for p in args.paths] or [ROOT / d for d in ("src", "include", "tools")]
    files = []
    for r in roots:
        files += [r] if r.is_file() else sorted(
            p for p in r.rglob("*") if p.suffix in (".cpp", ".h", ".cu", ".cuh", ".in"))
    long = []
    for f in files:
        for name, start, length in functions(f):
            if length > args.limit:
                long.append((length, f"{f.relative_to(ROOT) if f.is_absolute() else f}:{start}", name))
    for length, where, name in sorted(long, reverse=True):
        print(f"{where}: {name} is {length} lines (limit {args.limit})")
    if long:
        print(f"{len(long)} function(s) over {args.limit} lines", file=sys.stderr)
        return 1
    print(f"no function over {args.limit} lines in {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
