"""Put the zoo's scripts in place from local git clones of their repositories.

    python tests/zoo/populate.py karpathy/nanoGPT=/path/to/nanoGPT.git \\
        pytorch/examples=/path/to/examples.git Lightning-AI/pytorch-lightning=/path/to/lightning.git

Each argument names a repository of catalog.py and a git directory (or work tree) holding its
pinned commit. Every file is taken with `git show <commit>:<path>` into
ZOO_SCRIPTS/<entry>/ (default tests/zoo/scripts/), byte for byte, and checked against the
sha256 pinned in catalog.py; the repositories' licence texts go to ZOO_SCRIPTS/LICENSES/.
Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

import catalog


def _show(git_dir: str, commit: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", git_dir, "show", f"{commit}:{path}"], check=True,
                          capture_output=True).stdout


def main(argv: list[str]) -> int:
    clones = dict(arg.split("=", 1) for arg in argv)
    repos = {src.repo for e in catalog.ENTRIES.values() for src in e.sources}
    unknown = set(clones) - {r[0] for r in repos}
    if unknown or not clones:
        print(__doc__ + f"\nrepositories: {sorted(r[0] for r in repos)}", file=sys.stderr)
        return 2
    bad = 0
    for entry in catalog.ENTRIES.values():
        for src in entry.sources:
            if src.repo[0] not in clones:
                continue
            data = _show(clones[src.repo[0]], src.repo[1], src.path)
            if hashlib.sha256(data).hexdigest() != src.sha256:
                print(f"{src.url}: sha256 differs from catalog.py", file=sys.stderr)
                bad += 1
                continue
            dest = entry.folder / src.dest
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
    for name, commit, _licence in repos:
        if name in clones:
            dest = catalog.SCRIPTS / catalog.LICENCE_FILES[name]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(_show(clones[name], commit, "LICENSE"))
    print(f"zoo scripts in {catalog.SCRIPTS}; {bad} file(s) refused")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
