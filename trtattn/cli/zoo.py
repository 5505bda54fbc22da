"""trtattn zoo list | export: the built-in models (transformers, random weights, no downloads)."""

from __future__ import annotations

import json

from ..report import table


def add_parser(sub) -> None:
    z = sub.add_parser("zoo", help="the built-in models (transformers, random weights, no downloads)")
    zsub = z.add_subparsers(dest="zoo_command", required=True)
    zl = zsub.add_parser("list", help="list zoo models, their working exporters and attention sites")
    zl.add_argument("--json", action="store_true")
    ze = zsub.add_parser("export", help="export a zoo model to ONNX")
    ze.add_argument("name")
    ze.add_argument("--exporter", default="torchscript", help="torchscript (default) or dynamo")
    ze.add_argument("-o", "--output", required=True)
    ze.add_argument("--opset", type=int)
    ze.add_argument("--force", action="store_true", help="overwrite OUTPUT if it exists")


def run(args, progress) -> int:
    from .. import zoo

    if args.zoo_command == "list":
        rows = zoo.listing()
        if args.json:
            print(json.dumps([{k: r[k] for k in ("name", "exporters", "expected_sites", "classes")} for r in rows],
                             indent=2))
        else:
            shown = [{**r, "exporters": ", ".join(r["exporters"]),
                      "unsupported": "; ".join(f"{k}: {v}" for k, v in r["unsupported"].items())} for r in rows]
            print(table(shown, [("name", "model"), ("expected_sites", "sites"), ("exporters", "exporters"),
                                ("description", "what it exercises"), ("unsupported", "cannot export")]))
        return 0
    with progress.step(f"exporting {args.name} with {args.exporter}"):
        path = zoo.export(args.name, args.exporter, args.output, opset=args.opset, force=args.force)
    print(path)
    return 0
