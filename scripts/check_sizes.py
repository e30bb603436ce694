#!/usr/bin/env python3
"""Standing check of the code standard: no source file over 600 lines, no function body
over 80 (a soft "about" in the brief; this holds the line at those numbers). A function is a
top-level brace block (namespaces excepted) opened on a line with a parenthesis; string
and character literals and // comments are ignored when counting braces.
Usage: scripts/check_sizes.py [ROOT]; exits 1 naming every offender."""
import re
import subprocess
import sys

MAX_FILE, MAX_FUNCTION = 600, 80


def code_of(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
    return re.sub(r'//.*', '', line)


def long_functions(path):
    depth, start, out = 0, None, []
    for i, line in enumerate(open(path, encoding='utf-8', errors='replace').read().split('\n')):
        code = code_of(line)
        if re.match(r'\s*(namespace\b[^{]*|extern "C"\s*)\{\s*$', code):
            continue  # namespace braces do not nest functions
        if re.match(r'^\}\s*//\s*namespace', line):
            continue
        if depth == 0 and start is None and '{' in code and ')' in code and \
                not re.match(r'\s*(struct|class|enum|union)\b', code):
            start = (i, line.strip()[:70])
        depth += code.count('{') - code.count('}')
        if start is not None and depth == 0:
            n = i - start[0] + 1
            if n > MAX_FUNCTION:
                out.append(f'{path}:{start[0] + 1}: function of {n} lines: {start[1]}')
            start = None
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else '.'
    files = [f for f in subprocess.check_output(['git', '-C', root, 'ls-files', 'src', 'tests', 'bench', 'fuzz'],
                                                text=True).split() if f.endswith(('.cc', '.h', '.inc', '.cu', '.cuh'))]
    problems = []
    for f in files:
        path = f'{root}/{f}'
        n = sum(1 for _ in open(path, encoding='utf-8', errors='replace'))
        if n > MAX_FILE:
            problems.append(f'{f}: {n} lines (over {MAX_FILE}); split it by responsibility')
        problems += long_functions(path)
    for p in problems:
        print(p)
    print(f'{len(files)} sources: {len(problems)} over the limits ({MAX_FILE} lines a file, {MAX_FUNCTION} a function)')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
