"""``python -m grpo_trainer.tiny_model build OUT``: the tiny model of offline runs, built once.

Building imports torch and transformers: seconds of CPU at the start of every quickstart,
ahead of every other process (they load the model). The build is deterministic (the same
files, byte for byte, for the same flags, builder code and libraries), so the first build is
kept in a cache directory and later ones copy it without importing either. The key covers
the flags, ``grpo_trainer/models.py`` and the versions of the libraries that write the files;
``--no-cache`` always builds; ``--cache-only`` fills the cache and writes nothing else (a
7B shape built ahead of its runs, timed apart: benchmarks/seven_b_1gpu.py). The cache is
``$GRPO_TUI_CACHE/tiny-models``, else ``$XDG_CACHE_HOME/grpo-tui/tiny-models``, else
``~/.cache/grpo-tui/tiny-models``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

from grpo_trainer.cache import cache_dir

BUILDER = Path(__file__).with_name("models.py")
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "huggingface-hub")


def cache_root() -> Path:
    return cache_dir("tiny-models")


def cache_key(shape: dict[str, float | int]) -> str:
    """What the built files depend on: the builder's arguments, code and libraries."""
    parts = {
        "shape": shape,
        "builder": hashlib.sha256(BUILDER.read_bytes()).hexdigest(),
        "libraries": {name: version(name) for name in LIBRARIES},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _build(out: Path, shape: dict[str, float | int]) -> None:
    from grpo_trainer.models import build_tiny_model  # torch + transformers: seconds

    build_tiny_model(out, **shape)  # type: ignore[arg-type]


def fill(shape: dict[str, float | int]) -> tuple[Path | None, str]:
    """The cache entry of ``shape``, built now if missing: (entry, how), or (None, why)
    where the cache cannot be written."""
    entry = cache_root() / cache_key(shape)
    if entry.is_dir():
        return entry, "cached"
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".building-"))
    except OSError:
        return None, "cache not writable"
    try:
        _build(staging, shape)
        staging.rename(entry)  # atomic; a concurrent build that won leaves ours unused
    except OSError:
        if not entry.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entry, "built"


def build(out: Path, shape: dict[str, float | int], *, cache: bool = True) -> str:
    """Write the tiny model of ``shape`` (``build_tiny_model``'s arguments) to ``out``;
    returns where it came from (``built``, or the cache entry it was copied from)."""
    if not cache:
        _build(out, shape)
        return "built"
    entry, how = fill(shape)
    if entry is None:  # no writable cache: build in place
        _build(out, shape)
        return f"built ({how})"
    shutil.copytree(entry, out, dirs_exist_ok=True)
    return f"built, kept in {entry}" if how == "built" else f"copied from {entry}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m grpo_trainer.tiny_model")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("build", help="write the tiny randomly initialised model")
    cmd.add_argument("out", type=Path)
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--hidden-size", type=int, default=64)
    cmd.add_argument("--num-layers", type=int, default=2)
    cmd.add_argument("--num-heads", type=int, default=4)
    cmd.add_argument("--num-kv-heads", type=int, default=2)
    cmd.add_argument("--intermediate-size", type=int, default=128)
    cmd.add_argument("--final-norm-weight", type=float, default=6.0)
    cmd.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    cmd.add_argument("--no-cache", action="store_true", help="build even if a copy is cached")
    cmd.add_argument(
        "--cache-only",
        action="store_true",
        help="fill the cache and write nothing to OUT (a large shape built ahead of its runs)",
    )
    args = vars(parser.parse_args(argv))
    out, cache, cache_only = args.pop("out"), not args.pop("no_cache"), args.pop("cache_only")
    del args["command"]
    if cache_only:
        entry, how = fill(args)
        print(f"tiny model {how}{f' in {entry}' if entry else ''}", flush=True)
        if entry is None:
            raise SystemExit(1)
        return
    source = build(out, args, cache=cache)
    print(f"tiny model written to {out} ({source})", flush=True)


if __name__ == "__main__":
    main()
