#!/usr/bin/env python3
"""Removes earlier commits' build outputs from a Cargo `deps` directory.

Cargo names each artifact `<name>-<16 hex digits>[.<ext>]` and never
removes one a newer build replaced: a changed crate relinks every test
binary beside the old ones. Of each artifact name, whatever is more than
ten minutes older than its newest copy goes; copies built in one run (two
feature sets of one dependency) stay, and a wrong guess costs only a
rebuild. Prints the GiB freed.

    .ci/prune-stale-artifacts.py TARGET/debug/deps
"""
import os
import re
import sys

KEPT_WITHIN_SECONDS = 600


def main(deps):
    groups = {}
    for entry in os.scandir(deps):
        if not entry.is_file(follow_symlinks=False):
            continue
        name = re.sub(r"-[0-9a-f]{16}", "", entry.name, count=1)
        status = entry.stat(follow_symlinks=False)
        groups.setdefault(name, []).append((status.st_mtime, status.st_size, entry.path))
    freed = 0
    for copies in groups.values():
        newest = max(mtime for mtime, _, _ in copies)
        for mtime, size, path in copies:
            if newest - mtime > KEPT_WITHIN_SECONDS:
                os.remove(path)
                freed += size
    print(f"{freed / 2**30:.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
