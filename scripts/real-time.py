#!/usr/bin/env python3
"""Lists the test cases that run on real time, read from the tests' own attributes.

A case runs on paused tokio time when its `#[tokio::test]` says `start_paused = true` or its
body calls `tokio::time::pause()`; every other async case runs on real time. The macros of
`tests/support` say which of their cases do: `store_test!` and `timed_test!` run their `redis`
case on real time (a real `redis-server` keeps its own clock), and `store_test!(name,
real_time = "why")` and `ignore = "why"` their `memory` case too, with the reason beside it.

Prints one line per case: the file, the case, and why, where the code says (a `real_time` or
`ignore` reason; the doc above the test, from its `On real time`, or where it names what is
real: time, TCP, a server, processes; a server the test starts; or else the module doc line
that names what is real); then the count. With `--check`, prints only the count, and fails if a case is on real
time without a reason in the code.

Usage: scripts/real-time.py [--check]   (from the repository's root)
"""

import pathlib
import re
import sys

ATTR = re.compile(r"^\s*#\[tokio::test(\((?P<args>[^)]*)\))?\]", re.M)
FN = re.compile(r"\basync fn (\w+)")
MACRO = re.compile(
    r"^\s*(?P<macro>store_test|timed_test)!\(\s*(?P<name>\w+)\s*(,\s*(?P<mode>\w+)"
    r"(\s*=\s*(?P<why>\"(?:[^\"\\]|\\.)*\"))?)?\s*\)",
    re.M | re.S,
)
DOC_WHY = re.compile(
    r"real (time|tcp|`?redis|three-master|proxy|servers?|topolog|process|sockets?|listener)", re.I
)


SERVER = re.compile(r"\b(RedisServer|RedisCluster|RedisSentinel|Shared::redis|redis_url)\b")


def module_reason(text):
    """The module doc line that says why the file's tests run on real time, if one does."""
    for line in text.splitlines():
        if not line.startswith("//!"):
            if line.strip():
                break
            continue
        if DOC_WHY.search(line):
            return line[3:].strip()
    return None


def doc_above(text, start):
    """The doc lines just above position `start`, joined."""
    lines = text[:start].splitlines()
    doc = []
    for line in reversed(lines):
        stripped = line.strip()
        if stripped.startswith("///"):
            doc.append(stripped[3:].strip())
        elif stripped.startswith("#[") or not stripped:
            if doc or stripped.startswith("#["):
                continue
            break
        else:
            break
    return " ".join(reversed(doc))


def cases(path):
    text = path.read_text()
    reason = module_reason(text)
    found = []
    for attr in ATTR.finditer(text):
        args = attr.group("args") or ""
        if "start_paused" in args:
            continue
        name = FN.search(text, attr.end())
        if not name:
            continue
        following = ATTR.search(text, name.end())
        body = text[name.end() : following.start() if following else len(text)]
        if "tokio::time::pause()" in body:
            continue
        doc = doc_above(text, attr.start())
        if "On real time" in doc:
            why = doc[doc.index("On real time") :]
        elif DOC_WHY.search(doc):
            why = doc
        elif SERVER.search(body):
            why = "a real Redis server (or Cluster, or Sentinel service), on its own clock"
        else:
            why = reason
        found.append((name.group(1), why))
    for call in MACRO.finditer(text):
        name, mode = call.group("name"), call.group("mode")
        why = call.group("why")
        why = why.strip('"').replace("\\\n", " ") if why else None
        why = re.sub(r"\s+", " ", why) if why else None
        found.append((f"{name}::redis", "a real redis-server, on its own clock"))
        if mode in ("real_time", "ignore"):
            found.append((f"{name}::memory", why))
    return found


def main():
    check = "--check" in sys.argv[1:]
    roots = [pathlib.Path("tests"), pathlib.Path("src")]
    total, unexplained = 0, []
    for root in roots:
        for path in sorted(root.rglob("*.rs")):
            if path.parts[:2] == ("tests", "support"):
                continue
            for case, why in cases(path):
                total += 1
                if not check:
                    print(f"{path}\t{case}\t{why or '(no reason in the code)'}")
                if not why:
                    unexplained.append(f"{path}: {case}")
    print(f"{total} cases on real time")
    if check and unexplained:
        print("cases on real time without a reason in the code:", *unexplained, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
