"""Export folders as Optimum lays them out, from the zoo's generation parts, and the tokens `trtattn run`
generates from a folder: the folder tests (tests/test_folder.py) and the GPU engine tests (tests/trt) read them."""

from __future__ import annotations

import json
import shutil

from trtattn.cli import main


def encoder_decoder_folder(family, zoo_dir, root, start):
    """An encoder-decoder export folder as Optimum lays it out, from the zoo's generation parts."""
    from trtattn.zoo import generation

    paths = generation.export_family(family, zoo_dir)
    folder = root / "export"
    folder.mkdir()
    for part, stem in (("encoder", "encoder_model"), ("decoder-init", "decoder_model"),
                       ("decoder-step", "decoder_with_past_model")):
        shutil.copy(paths[f"{family}-{part}"], folder / f"{stem}.onnx")
    (folder / "generation_config.json").write_text(json.dumps({"decoder_start_token_id": start, "eos_token_id": 999}))
    return folder


def run_tokens(capsys, folder, *args) -> list[list[int]]:
    capsys.readouterr()
    assert main(["run", str(folder), "--generate", "8", "--json", *args]) == 0
    return [r["tokens"] for r in json.loads(capsys.readouterr().out)["requests"]]
