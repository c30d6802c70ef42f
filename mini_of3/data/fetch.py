"""``python -m mini_of3.data.fetch``: get mmCIF entries into a folder (default ``data/mmcif``) as ``<ID>.cif.gz``.

Sources: RCSB over HTTPS (default), a local mirror folder or any HTTP(S) base URL (``--mirror``), or, offline, the
entries shipped in the sdist of the PyPI package ``mdanalysistests==2.11.0`` (``--offline-package``), downloaded with
``pip download --no-deps`` into a temporary folder and read without installing it. The work is done in download.py
and offline.py; this module is the command line only. One line per failed id, a summary at the end, and a non-zero
exit only when nothing could be fetched.
"""
from __future__ import annotations

import argparse
import sys

from mini_of3.data.download import FetchError, fetch_ids, read_id_file
from mini_of3.data.offline import OFFLINE_ENTRIES, OFFLINE_PACKAGE, fetch_offline_package


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mini_of3.data.fetch", description=__doc__.splitlines()[0])
    parser.add_argument("ids", nargs="*", help="PDB ids (e.g. 1CRN 4HHB)")
    parser.add_argument("--ids", dest="id_file", help="file of PDB ids (whitespace separated, # comments)")
    parser.add_argument("--mirror", help="folder or http(s) base URL (or template with {ID}, {id}, {mid})")
    parser.add_argument("--offline-package", action="store_true",
                        help=f"take the entries of {OFFLINE_PACKAGE} ({', '.join(OFFLINE_ENTRIES)})")
    parser.add_argument("--archive", help="with --offline-package: use this package archive instead of pip download")
    parser.add_argument("--out", default="data/mmcif", help="destination folder (default: data/mmcif)")
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=4, help="parallel downloads")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    ids = list(args.ids) + (read_id_file(args.id_file) if args.id_file else [])
    if not ids and not args.offline_package:
        parser.error("give PDB ids, --ids FILE or --offline-package")
    results = []
    try:
        if args.offline_package:
            results.append(fetch_offline_package(args.out, archive=args.archive, progress=not args.quiet))
        if ids:
            results.append(fetch_ids(ids, args.out, args.mirror, retries=args.retries, jobs=args.jobs,
                                     progress=not args.quiet))
    except FetchError as err:
        print(f"fetch: {err}", file=sys.stderr)
        return 1
    for result in results:
        print(result.summary())
    if not any(result.ok for result in results):
        print("fetch: nothing could be fetched", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
