#!/usr/bin/env python3
"""The shape of the functions in the given C++ files: lines, brace depth,
parameters, and lambdas written inside loops.

Usage: function_shape.py [--max-lines N] [--max-depth N] [--max-params N] FILE...

A function's depth counts its own opening brace as 1 (namespaces and classes
do not count; lambdas and blocks inside it do). Its lines run from the line
of its opening brace to the line of its closing one. Its parameters are the
top-level commas of its parameter list, plus one. A lambda whose body opens
inside a loop's body (for, while, do) is reported wherever it sits.

Prints each violation as FILE:LINE: FUNCTION: what, and exits 1 if any.
This is a lexical reading (comments, strings and preprocessor lines are
blanked first), enough for this project's code, not a C++ parser.
"""
import argparse
import re
import sys


def blank(text):
    """Comments, string and character literals and preprocessor lines
    replaced by spaces (newlines kept, so line numbers hold)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            j = i
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    out.append(" \n")
                    continue
                out.append(" ")
                j += 1
            i = j
            continue
        if c in " \t":
            out.append(c)
            i += 1
            continue
        line_start = c == "\n"
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:j]))
            i = j
            continue
        m = re.match(r'R"([^(]*)\(', text[i:i + 40])
        if m:
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('"' + "".join("\n" if ch == "\n" else " " for ch in text[i + 1:j - 1]) + '"')
            i = j
            continue
        if c in "\"'":
            # A digit separator (1'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum():
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def param_count(header):
    """Parameters of the last function signature in `header`."""
    # The parameter list: the first top-level (...) after the name, ignoring
    # a trailing constructor initializer list (": a_(x), b_(y)").
    depth_angle = 0
    start = None
    depth = 0
    for i, c in enumerate(header):
        if c == "<" and depth == 0:
            depth_angle += 1
        elif c == ">" and depth == 0 and depth_angle > 0:
            depth_angle -= 1
        elif c == "(" and depth_angle == 0:
            if depth == 0 and start is None:
                start = i
            depth += 1
        elif c == ")" and depth_angle == 0 and depth > 0:
            depth -= 1
            if depth == 0 and start is not None:
                inner = header[start + 1:i]
                if not inner.strip() or inner.strip() == "void":
                    return 0
                d, commas = 0, 0
                for ch in inner:
                    if ch in "([{<":
                        d += 1
                    elif ch in ")]}>":
                        d -= 1
                    elif ch == "," and d == 0:
                        commas += 1
                return commas + 1
    return 0


LAMBDA = re.compile(r"\]\s*(\([^()]*(\([^()]*\)[^()]*)*\))?\s*(mutable\s*)?(->\s*[\w:<>&*, ]+)?\s*$")
LOOP = re.compile(r"^\s*(for|while)\s*\(|^\s*do\s*$|\}\s*while")


def function_name(header):
    m = re.search(r"([~\w:]+(?:<[^<>]*>)?|operator\s*\S+)\s*\(", header)
    return m.group(1) if m else "?"


def check(path, text, limits):
    src = blank(text)
    problems = []
    # Scopes: (kind, line, name, depth, header)
    stack = []
    last = 0  # where the text since the last ; { } starts
    line = 1
    func = None  # [name, start line, max depth, params]
    for i, c in enumerate(src):
        if c == "\n":
            line += 1
            continue
        if c not in "{};":
            continue
        header = src[last:i]
        last = i + 1
        if c == ";":
            continue
        if c == "}":
            if not stack:
                continue
            kind, start, name, depth, _ = stack.pop()
            if kind == "func":
                lines = line - start + 1
                if lines > limits.max_lines:
                    problems.append(f"{path}:{start}: {name}: {lines} lines (at most {limits.max_lines})")
                if func[2] > limits.max_depth:
                    problems.append(f"{path}:{start}: {name}: brace depth {func[2]} (at most {limits.max_depth})")
                if func[3] > limits.max_params:
                    problems.append(f"{path}:{start}: {name}: {func[3]} parameters (at most {limits.max_params})")
                func = None
            continue
        # An opening brace: what scope it opens.
        outer = stack[-1][0] if stack else "ns"
        flat = " ".join(header.split())
        if outer in ("ns", "class"):
            if re.search(r"\bnamespace\b", flat):
                stack.append(("ns", line, "", 0, flat))
            elif re.search(r"\b(class|struct|union|enum)\b", flat) and "(" not in flat.split(":")[0]:
                stack.append(("class", line, "", 0, flat))
            elif ")" in flat:
                name = function_name(flat)
                params = param_count(flat)
                stack.append(("func", line, name, 1, flat))
                func = [name, line, 1, params]
            else:
                stack.append(("init", line, "", 0, flat))  # an initializer: = { ... }
            continue
        if outer == "init":
            stack.append(("init", line, "", 0, flat))
            continue
        depth = stack[-1][3] + 1
        is_lambda = bool(LAMBDA.search(header)) and "[" in header
        kind = "lambda" if is_lambda else ("loop" if LOOP.search(flat) else "block")
        if is_lambda and any(s[0] == "loop" for s in stack):
            problems.append(f"{path}:{line}: {func[0] if func else '?'}: a lambda defined inside a loop")
        stack.append((kind, line, "", depth, flat))
        if func is not None:
            func[2] = max(func[2], depth)
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-lines", type=int, default=100)
    ap.add_argument("--max-depth", type=int, default=6)
    ap.add_argument("--max-params", type=int, default=8)
    ap.add_argument("files", nargs="+")
    limits = ap.parse_args()
    problems = []
    for path in limits.files:
        with open(path, encoding="utf-8") as f:
            problems += check(path, f.read(), limits)
    for p in problems:
        print(p)
    print(f"{len(limits.files)} files, {len(problems)} violations")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
