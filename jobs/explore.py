"""Write a static HTML explorer of an index (and its graph as GraphML for Gephi / yEd):

    spark-submit jobs/explore.py --config conf/local.yaml --out output/explorer

Open <out>/index.html in a browser (no server or network needed); it loads one small data file
per community, entity bucket and text-unit bucket as you browse.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cli import base_parser, job_config, user_errors  # noqa: E402

SECTIONS = ["storage", "spark"]


def build_parser():
    parser = base_parser(__doc__, SECTIONS)
    parser.add_argument("--out", default="output/explorer", help="folder the explorer is written to (default: output/explorer)")
    parser.add_argument("--no-graphml", action="store_true", help="skip the GraphML export")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # Imported after parsing, so --help and argument mistakes cost no Spark import.
    from graphrag_spark.explore import write_explorer
    from graphrag_spark.session import build_spark

    with user_errors():
        cfg = job_config(args)
        written = write_explorer(build_spark(cfg.spark, master=args.master), cfg, args.out, not args.no_graphml)
        print(f"Explorer written to {written.root / 'index.html'}: {written.files} files, "
              f"{written.bytes / 1e6:.1f} MB in all" + (f"; GraphML: {written.graphml}" if written.graphml else ""))


if __name__ == "__main__":
    main()
