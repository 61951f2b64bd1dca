#!/usr/bin/env python3
"""Checks that the CMake build mirrors the Bazel build, target by target.

    cmake/check_mirror.py [--fix] [REPO_ROOT]

For every C++ rule of every BUILD.bazel (cc_library, cc_binary, cc_test,
nccl_cc_library, nccl_cc_test, gradsync_cc_grpc_library) the CMakeLists.txt
of the same folder must have the gradsync_cc_* rule of the same name
(cmake/GradsyncRules.cmake) with the same srcs, hdrs, deps and data, and the
other way round; every folder's CMakeLists.txt must be added by its parent's;
every //third_party/system library needs its gradsync_system_<name> in
cmake/*.cmake. Labels are compared in full ("//pkg:name"); a dependency Bazel
adds only `if HAS_NCCL` is an OPTIONAL_DEPS entry in CMake.

Exits 1 naming each difference. With --fix it rewrites the CMakeLists.txt
files that differ (rules in Bazel's order, each package's own dependencies
first; comments above rules kept) and creates missing ones; what it cannot
fix (third_party/system, a new top-level folder) is still reported.
"""
import os
import re
import sys

BAZEL_KINDS = {
    "cc_library": "library",
    "nccl_cc_library": "library",
    "cc_binary": "binary",
    "cc_test": "test",
    "nccl_cc_test": "test",
    "gradsync_cc_grpc_library": "grpc_library",
}
SKIP_DIRS = {".git", "build", "third_party", ".gpudeps"}
# Field order of an emitted rule; all but NAME are lists.
FIELDS = ["SIZE", "SRCS", "HDRS", "DEFINES", "DATA", "DEPS", "OPTIONAL_DEPS"]
COMPARED = ["kind", "srcs", "hdrs", "deps", "data"]


def full_label(label, pkg):
    """'//a/b' -> '//a/b:b', ':x' -> '//pkg:x'; others unchanged."""
    if label.startswith(":"):
        return "//%s%s" % (pkg, label)
    if label.startswith("//") and ":" not in label:
        return "%s:%s" % (label, label.rsplit("/", 1)[-1])
    return label


def blank_comments(text):
    """The text with every comment replaced by spaces (offsets unchanged)."""
    return re.sub(r"#[^\n]*", lambda m: " " * len(m.group(0)), text)


def calls(text, start_re):
    """(kind, start, end, body) of each call matched by start_re at a line
    start, the body running to the parenthesis that closes the call."""
    code = blank_comments(text)
    for m in start_re.finditer(code):
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        yield m.group(1), m.start(), i, code[m.end():i - 1]


def comment_above(text, start):
    """The comment lines right above offset `start`."""
    lines = text[:start].split("\n")[:-1]
    block = []
    while lines and lines[-1].lstrip().startswith("#"):
        block.insert(0, lines.pop())
    return block


class Rule(object):
    def __init__(self, kind, name, fields, pkg, comment):
        self.kind, self.name, self.fields, self.comment = kind, name, fields, comment
        labels = lambda *keys: {full_label(l, pkg) for k in keys for l in fields.get(k, [])}
        self.compared = {
            "kind": kind,
            "srcs": set(fields.get("SRCS", [])),
            "hdrs": set(fields.get("HDRS", [])),
            "deps": labels("DEPS", "OPTIONAL_DEPS"),
            "data": labels("DATA"),
        }
        self.local_deps = {l[1:] for k in ("DEPS", "OPTIONAL_DEPS", "DATA")
                           for l in fields.get(k, []) if l.startswith(":")}

    def cmake(self, comment):
        lines = comment + ["gradsync_cc_%s(" % self.kind, "  NAME %s" % self.name]
        for key in FIELDS:
            values = self.fields.get(key, [])
            if len(values) == 1:
                lines.append("  %s %s" % (key, values[0]))
            elif values:
                lines += ["  %s" % key] + ["    %s" % v for v in values]
        return "\n".join(lines + [")"])


def bazel_list(body, attr):
    m = re.search(r"\b%s\s*=\s*\[(.*?)\]" % attr, body, re.S)
    return re.findall(r'"([^"]+)"', m.group(1)) if m else []


def parse_bazel(path, pkg):
    text = open(path).read()
    start = re.compile(r"^(%s)\(" % "|".join(BAZEL_KINDS), re.M)
    rules = []
    for kind, begin, _, body in calls(text, start):
        name = re.search(r'\bname\s*=\s*"([^"]+)"', body).group(1)
        size = re.search(r'\bsize\s*=\s*"([^"]+)"', body)
        deps = bazel_list(body, "deps")
        others = set(deps) | set(bazel_list(body, "data")) | set(bazel_list(body, "visibility"))
        fields = {
            "SIZE": [size.group(1)] if size else [],
            "SRCS": bazel_list(body, "srcs"),
            "HDRS": bazel_list(body, "hdrs"),
            "DEFINES": bazel_list(body, "defines"),
            "DATA": bazel_list(body, "data"),
            "DEPS": deps,
            # Labels outside deps/data/visibility: `+ ([..] if HAS_NCCL else [])`.
            "OPTIONAL_DEPS": sorted(set(re.findall(r'"([/:@][^"]*)"', body)) - others),
        }
        rules.append(Rule(BAZEL_KINDS[kind], name, fields, pkg, comment_above(text, begin)))
    header = []
    for line in text.split("\n"):
        if not line.startswith("#"):
            break
        header.append(line)
    return header, rules


def parse_cmake(path, pkg):
    """(rules, spans): spans are (start, end) offsets of each rule including
    the comment lines above it."""
    text = open(path).read()
    start = re.compile(r"^gradsync_cc_(library|binary|test|grpc_library)\(", re.M)
    rules, spans = [], []
    for kind, begin, end, body in calls(text, start):
        fields, key = {}, None
        for token in body.split():
            if token in FIELDS or token == "NAME":
                key = token
                fields.setdefault(key, [])
            elif key:
                fields[key].append(token)
        comment = comment_above(text, begin)
        rules.append(Rule(kind, fields["NAME"][0], fields, pkg, comment))
        spans.append((begin - sum(len(l) + 1 for l in comment), end))
    return text, rules, spans


def in_dependency_order(rules):
    """Bazel's order, with each rule's same-package dependencies moved first
    (the CMake rules need them declared first; see GradsyncRules.cmake)."""
    by_name = {r.name: r for r in rules}
    done, order = set(), []

    def visit(rule):
        if rule.name in done:
            return
        done.add(rule.name)
        for dep in sorted(rule.local_deps):
            if dep in by_name:
                visit(by_name[dep])
        order.append(rule)

    for rule in rules:
        visit(rule)
    return order


def added_by_parent(folder):
    parent = os.path.join(os.path.dirname(folder), "CMakeLists.txt")
    if not os.path.exists(parent):
        return False
    text = blank_comments(open(parent).read())
    pattern = r"add_subdirectory\(\s*%s\s*\)" % re.escape(os.path.basename(folder))
    return re.search(pattern, text) is not None


def add_to_parent(folder, root, problems):
    """Adds add_subdirectory(<folder>) to the parent's CMakeLists.txt, after
    its last add_subdirectory, creating the parent's file if needed."""
    parent_dir = os.path.dirname(folder)
    if parent_dir == root:
        problems.append("%s: a new top-level folder: add it to the root CMakeLists.txt"
                        " by hand, in dependency order" % os.path.basename(folder))
        return
    parent = os.path.join(parent_dir, "CMakeLists.txt")
    line = "add_subdirectory(%s)" % os.path.basename(folder)
    if not os.path.exists(parent):
        open(parent, "w").write(line + "\n")
        add_to_parent(parent_dir, root, problems)
        return
    text = open(parent).read()
    subdirs = list(re.finditer(r"^add_subdirectory\([^)]*\)\n", text, re.M))
    if subdirs:
        at = subdirs[-1].end()
    else:
        first_rule = re.search(r"^gradsync_cc_", text, re.M)
        at = first_rule.start() if first_rule else len(text)
    open(parent, "w").write(text[:at] + line + "\n" + text[at:])


def fix_package(root, folder, pkg, header, bazel, cmake_path, cmake_text, cmake, spans,
                problems):
    """Rewrites (or writes) folder's CMakeLists.txt to mirror `bazel`."""
    existing = {r.name: r for r in cmake}
    if cmake_text is None:
        head = "\n".join(header + ["# Mirrors %s/BUILD.bazel (see cmake/GradsyncRules.cmake)."
                                   % pkg]) + "\n"
    else:
        # Everything outside the rules must come before them to be kept.
        head = cmake_text[:spans[0][0]] if spans else cmake_text
        rest = "".join(cmake_text[end:start] for (_, end), (start, _) in
                       zip(spans, spans[1:] + [(len(cmake_text), 0)]))
        if rest.strip():
            problems.append("%s: statements between or after its rules; mirror by hand"
                            % cmake_path)
            return
    blocks = [r.cmake(existing[r.name].comment if r.name in existing else r.comment)
              for r in in_dependency_order(bazel)]
    head = head.rstrip("\n") + "\n\n" if head.strip() else ""
    open(cmake_path, "w").write(head + "\n\n".join(blocks) + "\n")
    if cmake_text is None and not added_by_parent(folder):
        add_to_parent(folder, root, problems)


def check_system_libraries(root):
    """Every //third_party/system library has its gradsync_system_<name>."""
    text = blank_comments(open(os.path.join(root, "third_party/system/BUILD")).read())
    names = re.findall(r'^cc_library\(\s*name\s*=\s*"([^"]+)"', text, re.M)
    cmake_dir = os.path.join(root, "cmake")
    defined = set()
    for f in os.listdir(cmake_dir):
        if f.endswith(".cmake"):
            defined |= set(re.findall(r"add_library\(gradsync_system_(\w+)",
                                      open(os.path.join(cmake_dir, f)).read()))
    return ["//third_party/system:%s: no gradsync_system_%s in cmake/*.cmake "
            "(GradsyncDeps.cmake); add it by hand" % (n, n) for n in names if n not in defined]


def check(root, fix):
    problems, fixed = [], []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs
                         if d not in SKIP_DIRS and not d.startswith("bazel-"))
        pkg = os.path.relpath(folder, root).replace(os.sep, "/")
        cmake_path = os.path.join(folder, "CMakeLists.txt")
        header, bazel = ([], [])
        if "BUILD.bazel" in files:
            header, bazel = parse_bazel(os.path.join(folder, "BUILD.bazel"), pkg)
        cmake_text, cmake, spans = (None, [], [])
        if os.path.exists(cmake_path):
            cmake_text, cmake, spans = parse_cmake(cmake_path, pkg)
        here = []
        if cmake_text is not None and pkg != "." and not added_by_parent(folder):
            here.append("%s/CMakeLists.txt: not added by add_subdirectory(%s) in its "
                        "parent's CMakeLists.txt" % (pkg, os.path.basename(folder)))
        b_rules, c_rules = {r.name: r for r in bazel}, {r.name: r for r in cmake}
        for name in sorted(set(b_rules) | set(c_rules)):
            where = "//%s:%s" % (pkg, name)
            if name not in c_rules:
                here.append("%s: in BUILD.bazel, missing from %s/CMakeLists.txt" % (where, pkg))
            elif name not in b_rules:
                here.append("%s: in CMakeLists.txt, not in BUILD.bazel" % where)
            else:
                for field in COMPARED:
                    b, c = b_rules[name].compared[field], c_rules[name].compared[field]
                    if b != c:
                        if isinstance(b, set):
                            b, c = sorted(b - c), sorted(c - b)
                        here.append("%s: %s differ: Bazel only %s, CMake only %s"
                                    % (where, field, b, c))
        if here and fix and (bazel or cmake):
            before = len(problems)
            fix_package(root, folder, pkg, header, bazel, cmake_path, cmake_text, cmake,
                        spans, problems)
            if len(problems) == before:
                fixed.append(cmake_path)
                continue
        problems += here
    problems += check_system_libraries(root)
    return problems, fixed


def main():
    args = [a for a in sys.argv[1:] if a != "--fix"]
    fix = "--fix" in sys.argv[1:]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
    problems, fixed = check(root, fix)
    for path in fixed:
        print("check_mirror: rewrote %s" % os.path.relpath(path, root))
    for p in problems:
        print("check_mirror: " + p, file=sys.stderr)
    if problems:
        print("check_mirror: the CMake build does not mirror Bazel; run "
              "cmake/check_mirror.py --fix (then review the diff) or edit the "
              "CMakeLists.txt named above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
