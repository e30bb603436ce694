#!/usr/bin/env python3
"""Runs the command blocks of README.md and docs/*.md, so the docs cannot rot.

Every ```sh block carries a mark on the line before it:
  <!-- runnable -->            run by the default test suite (ctest docs_commands)
  <!-- runnable: slow -->      run under the slow label (ctest docs_commands_slow)
  <!-- not run: REASON -->     never run (needs a GPU, a cluster, packages, root ...)
A block without a mark fails the check, as does a relative link to a file that is not there.

The runnable blocks of one file run in order, in one fresh directory per file, each with
`bash -e -o pipefail`; `build/release` there is the build directory under test and
`configs`, `scripts`, `bench` and `tests` are the repository's (read-only by convention:
the blocks write only under the scratch directory). A failing block is reported with its
file, line, text and the last lines of its output.

usage: check_docs.py REPO BUILD_DIR [--slow] [--only FILE] [--list]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

MARK = re.compile(r"^<!--\s*(runnable(?::\s*slow)?|not run:[^>]*\S)\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def doc_files(repo):
    files = [os.path.join(repo, "README.md")]
    docs = os.path.join(repo, "docs")
    files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return files


def blocks(path):
    """Yields (line, language, mark, text) for each fenced block; mark None when unmarked."""
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = start - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        mm = MARK.match(lines[prev]) if prev >= 0 else None
        yield start + 1, lang, (mm.group(1) if mm else None), "\n".join(lines[start + 1:j])
        i = j + 1


def check_marks_and_links(path, repo):
    errors = []
    for line, lang, mark, _ in blocks(path):
        if lang in ("sh", "bash", "console") and mark is None:
            errors.append(f"{os.path.relpath(path, repo)}:{line}: a ```{lang} block without a mark "
                          "(<!-- runnable -->, <!-- runnable: slow --> or <!-- not run: REASON -->)")
    text = open(path, encoding="utf-8").read()
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        full = os.path.normpath(os.path.join(os.path.dirname(path), target))
        if not os.path.exists(full):
            line = text[:m.start()].count("\n") + 1
            errors.append(f"{os.path.relpath(path, repo)}:{line}: link to '{target}', which does not exist")
    return errors


def scratch_for(repo, build):
    d = tempfile.mkdtemp(prefix="loom-docs-")
    os.makedirs(os.path.join(d, "build"))
    os.symlink(os.path.abspath(build), os.path.join(d, "build", "release"))
    for name in ("configs", "scripts", "bench", "tests"):
        os.symlink(os.path.join(repo, name), os.path.join(d, name))
    os.makedirs(os.path.join(d, "docs", "figures"))
    return d


def run_file(path, repo, build, slow):
    want = {"runnable"} | ({"runnable: slow"} if slow else set())
    todo = [(line, text) for line, lang, mark, text in blocks(path) if mark in want]
    if not todo:
        return 0, 0
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    scratch = scratch_for(repo, build)
    failed = 0
    try:
        for line, text in todo:
            t0 = time.time()
            p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=scratch, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
            rel = os.path.relpath(path, repo)
            print(f"{rel}:{line}: exit {p.returncode} in {time.time() - t0:.1f} s", flush=True)
            if p.returncode != 0:
                out = p.stdout.decode(errors="replace").splitlines()
                print(f"FAILED {rel}:{line}\n--- block ---\n{text}\n--- last output ---\n" +
                      "\n".join(out[-30:]), flush=True)
                failed += 1
                break  # later blocks of the file build on this one
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return len(todo), failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("build")
    ap.add_argument("--slow", action="store_true", help="also run the blocks marked runnable: slow")
    ap.add_argument("--only", help="one file (a path relative to the repository)")
    ap.add_argument("--list", action="store_true", help="list the blocks and their marks; run nothing")
    a = ap.parse_args()
    repo = os.path.abspath(a.repo)
    files = doc_files(repo)
    if a.only:
        files = [f for f in files if os.path.relpath(f, repo) == a.only]
        if not files:
            sys.exit(f"--only {a.only}: not one of README.md, docs/*.md")
    errors = [e for f in files for e in check_marks_and_links(f, repo)]
    for e in errors:
        print(e)
    if a.list:
        for f in files:
            for line, lang, mark, _ in blocks(f):
                print(f"{os.path.relpath(f, repo)}:{line}: {lang or '-'} {mark}")
        return 1 if errors else 0
    ran = failed = 0
    for f in files:
        n, bad = run_file(f, repo, a.build, a.slow)
        ran, failed = ran + n, failed + bad
    print(f"{ran} blocks run, {failed} failed; {len(errors)} unmarked blocks or broken links")
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
