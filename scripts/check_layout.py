#!/usr/bin/env python3
"""The layout rules of src/ (docs/architecture.md): no source file over 1,000 lines, no function
over 60 lines (from the line that opens its parameter list to its closing brace), and no
comment with more than one measured figure (a time, bandwidth or ratio; comments alone on
consecutive lines count as one; the history of a threshold belongs in docs/tuning.md under its
id). Braces that do not balance are reported too, since they hide functions. Prints each break
and exits 1 if there is any.

    python3 scripts/check_layout.py [DIR ...]      (default: src)
"""
import os
import re
import sys

MAX_FILE_LINES = 1000
MAX_FUNCTION_LINES = 60
NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
UNIT = (r"(?<![\w.,])" + NUMBER + r"(?:\s*-\s*" + NUMBER + r")?\s*"
        r"(?:us|µs|ns|ms|s|x|[GM]i?B/s|[GM]bit/s|[GM]b/s|%)(?!\w)")
FIGURE = re.compile(UNIT + r"|(?<![\w.^])\d+\.\d+(?![\w.])|" + NUMBER + r" against " + NUMBER)


def scan(text):
    """(code, comments): text with comments, string and character contents and preprocessor
    lines (with their continuations) turned to spaces, newlines kept; and each comment as
    (first line, last line, text, whole_lines) where whole_lines says nothing but the comment
    stands on its lines."""
    out, comments, i, n = [], [], 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and text[i:].lstrip(" \t").startswith("#"):
            j = i
            while True:
                k = text.find("\n", j)
                k = n if k < 0 else k
                if k > 0 and text[k - 1] == "\\" and k < n:
                    j = k + 1
                    continue
                break
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
            continue
        if text.startswith("/*", i) or text.startswith("//", i):
            if text.startswith("/*", i):
                j = text.find("*/", i + 2)
                j = n if j < 0 else j + 2
            else:
                j = text.find("\n", i)
                j = n if j < 0 else j
            first = text.count("\n", 0, i) + 1
            bol = text.rfind("\n", 0, i) + 1
            eol = text.find("\n", j)
            eol = n if eol < 0 else eol
            whole = not text[bol:i].strip() and not text[j:eol].strip()
            comments.append((first, first + text.count("\n", i, j), text[i:j], whole))
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            line_start = False
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j, n - 1)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j]) + text[j])
            i = j + 1
            line_start = text[j] == "\n"
            continue
        out.append(c)
        line_start = c == "\n" or (line_start and c in " \t")
        i += 1
    return "".join(out), comments


def long_functions(code):
    """(first line, last line) of each function body over the limit, and the problems that
    stop the count (unbalanced braces). A function's first line is the line of the opening
    parenthesis of its parameter list; a brace after anything but ')' opens no function."""
    found, depth, start = [], 0, None
    for pos, ch in enumerate(code):
        if ch == "{":
            if depth == 0:
                start = signature_line(code, pos)
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                return found, [f"line {code.count(chr(10), 0, pos) + 1}: a '}}' without its '{{'"]
            if depth == 0 and start is not None:
                end = code.count("\n", 0, pos) + 1
                if end - start + 1 > MAX_FUNCTION_LINES:
                    found.append((start, end))
                start = None
    return found, ["braces do not balance at the end of the file"] if depth else []


def signature_line(code, brace):
    """The line of the '(' that opens the parameter list before the '{' at brace, or None."""
    k = brace - 1
    while k >= 0 and code[k].isspace():
        k -= 1
    if k < 0 or code[k] != ")":
        return None
    parens = 0
    while k >= 0:
        parens += {")": 1, "(": -1}.get(code[k], 0)
        if parens == 0:
            return code.count("\n", 0, k) + 1
        k -= 1
    return None


def comment_blocks(comments):
    """(line, text) of each comment block: comments that stand alone on consecutive lines are
    one block; a comment after code is a block of its own."""
    block = None
    for first, last, body, whole in comments:
        if block and whole and block[3] and first == block[1] + 1:
            block = (block[0], last, block[2] + "\n" + body, True)
            continue
        if block:
            yield block[0], block[2]
        block = (first, last, body, whole)
    if block:
        yield block[0], block[2]


def check(path):
    text = open(path, encoding="utf-8").read()
    problems = []
    nlines = text.count("\n")
    if nlines > MAX_FILE_LINES:
        problems.append(f"{path}: {nlines} lines (at most {MAX_FILE_LINES})")
    code, comments = scan(text)
    found, unreadable = long_functions(code)
    for first, last in found:
        problems.append(f"{path}:{first}: a function of {last - first + 1} lines "
                        f"(at most {MAX_FUNCTION_LINES})")
    problems += [f"{path}: {why}: functions after it cannot be measured" for why in unreadable]
    for line, block in comment_blocks(comments):
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
