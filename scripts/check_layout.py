#!/usr/bin/env python3
"""The layout rules of src/ (docs/architecture.md): no source file over 1,000 lines, no function
over 60 lines (from the first line of its signature to its closing brace), and no comment with
more than one measured figure (a time, bandwidth or ratio; the history of a threshold belongs in
docs/tuning.md under its id). Prints each break and exits 1 if there is any.

    python3 scripts/check_layout.py [DIR ...]      (default: src)
"""
import os
import re
import sys

MAX_FILE_LINES = 1000
MAX_FUNCTION_LINES = 60
UNIT = r"(?<![\w.])\d+(?:\.\d+)?(?:\s*-\s*\d+(?:\.\d+)?)?\s*(?:us|µs|ns|ms|s|x|GB/s|MB/s|%)(?!\w)"
FIGURE = re.compile(UNIT + r"|(?<![\w.^])\d+\.\d+(?![\w.])|\d+ against \d+")


def blank_comments_and_strings(text):
    """text with comments and string contents turned to spaces, newlines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text[i] in "\"'":
            j = i + 1
            while j < n and text[j] != text[i]:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i] + " " * (j - i - 1) + text[i])
            i = j + 1
            continue
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return "".join(out)


def long_functions(text):
    """(first line, last line) of each function body over the limit."""
    depth, start, head, found = 0, None, None, []
    for number, line in enumerate(blank_comments_and_strings(text).split("\n"), 1):
        if line.startswith("#"):
            continue
        if depth == 0 and head is None and line.strip():
            head = number
        for ch in line:
            if ch == "{":
                if depth == 0:
                    before = line.split("{")[0]
                    start = head if ")" in before or not before.strip() else None
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    if start is not None and number - start + 1 > MAX_FUNCTION_LINES:
                        found.append((start, number))
                    start, head = None, None
        if depth == 0 and line.rstrip().endswith(";"):
            head = None
    return found


def comment_blocks(text):
    """(line, text) of each comment block."""
    for m in re.finditer(r"/\*.*?\*/", text, re.S):
        yield text.count("\n", 0, m.start()) + 1, m.group(0)
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("//"):
            j = i
            while j < len(lines) and lines[j].lstrip().startswith("//"):
                j += 1
            yield i + 1, "\n".join(lines[i:j])
            i = j
        else:
            i += 1


def check(path):
    text = open(path, encoding="utf-8").read()
    problems = []
    nlines = text.count("\n")
    if nlines > MAX_FILE_LINES:
        problems.append(f"{path}: {nlines} lines (at most {MAX_FILE_LINES})")
    for first, last in long_functions(text):
        problems.append(f"{path}:{first}: a function of {last - first + 1} lines "
                        f"(at most {MAX_FUNCTION_LINES})")
    for line, block in comment_blocks(text):
        figures = FIGURE.findall(block)
        if len(figures) > 1:
            problems.append(f"{path}:{line}: a comment with {len(figures)} measured figures "
                            f"({', '.join(figures[:3])}): keep one line of why, the history "
                            "in docs/tuning.md")
    return problems


def main(roots):
    problems = []
    for root in roots:
        for folder, _, files in os.walk(root):
            for name in sorted(files):
                if name.endswith((".c", ".h", ".def")):
                    problems += check(os.path.join(folder, name))
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["src"]))
