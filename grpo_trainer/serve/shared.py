"""Model parameters kept in a memory-mapped file that several processes share.

Layout of ``--shared-weights DIR``: ``weights.bin`` holds every parameter back to back
(one dtype), ``manifest.json`` lists name, shape and element offset of each. A process
that maps the file replaces each parameter's storage by a view of the mapping, so a write
by one process (the trainer's optimizer step) is what the other (the server) computes
with, with no copy. The server maps an existing file instead of reloading the model, so
a restarted server keeps the trained weights. CPU only: the file lives in host memory;
on CUDA the server shares its parameters through CUDA IPC instead (``cuda_ipc.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from grpo_trainer.models import DTYPES

MANIFEST = "manifest.json"
WEIGHTS = "weights.bin"


class SharedWeightsError(RuntimeError):
    """The shared-weights directory does not fit the model (names, shapes, dtype, device)."""


class TensorEntry(BaseModel):
    """Where one parameter lives in ``weights.bin``."""

    model_config = ConfigDict(extra="forbid")

    name: str
    shape: list[int]
    offset: int
    numel: int


class Manifest(BaseModel):
    """The table of contents of ``weights.bin``."""

    model_config = ConfigDict(extra="forbid")

    dtype: str
    numel: int
    tensors: list[TensorEntry]


def _dtype_name(dtype: torch.dtype) -> str:
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise SharedWeightsError(f"unsupported parameter dtype {dtype}")


def _parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    params = list(model.named_parameters())
    devices = {p.device.type for _, p in params}
    if devices != {"cpu"}:
        raise SharedWeightsError(f"shared weights need a CPU model, got devices {devices}")
    dtypes = {p.dtype for _, p in params}
    if len(dtypes) != 1:
        raise SharedWeightsError(f"shared weights need one parameter dtype, got {dtypes}")
    return params


def manifest_for(model: nn.Module) -> Manifest:
    """The manifest describing ``model``'s parameters laid out back to back."""
    params = _parameters(model)
    entries: list[TensorEntry] = []
    offset = 0
    for name, param in params:
        entries.append(
            TensorEntry(name=name, shape=list(param.shape), offset=offset, numel=param.numel())
        )
        offset += param.numel()
    return Manifest(dtype=_dtype_name(params[0][1].dtype), numel=offset, tensors=entries)


def read_manifest(directory: Path) -> Manifest | None:
    """The manifest in ``directory``, or None if no shared weights were written there."""
    path = directory / MANIFEST
    if not path.is_file():
        return None
    return Manifest.model_validate_json(path.read_text())


def write_shared_weights(model: nn.Module, directory: Path) -> Manifest:
    """Write ``model``'s parameters to ``directory`` (weights first, manifest last, atomic)."""
    manifest = manifest_for(model)
    directory.mkdir(parents=True, exist_ok=True)
    flat = torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])
    tmp_weights = directory / f".{WEIGHTS}.tmp"
    with open(tmp_weights, "wb") as handle:
        handle.write(flat.numpy().tobytes())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp_weights, directory / WEIGHTS)
    tmp_manifest = directory / f".{MANIFEST}.tmp"
    tmp_manifest.write_text(manifest.model_dump_json(indent=1))
    os.replace(tmp_manifest, directory / MANIFEST)
    return manifest


def map_shared_weights(model: nn.Module, directory: Path, *, copy_in: bool) -> Manifest:
    """Make ``model``'s parameters views of the mapped ``weights.bin`` in ``directory``.

    ``copy_in=False`` (server): the file's values become the model's. ``copy_in=True``
    (trainer): the model's current values are written into the file first.
    """
    manifest = read_manifest(directory)
    if manifest is None:
        raise SharedWeightsError(f"no shared weights in {directory} ({MANIFEST} missing)")
    expected = manifest_for(model)
    if expected.dtype != manifest.dtype:
        raise SharedWeightsError(
            f"shared weights in {directory} are {manifest.dtype}, the model is {expected.dtype}"
        )
    if expected.tensors != manifest.tensors:
        mine = {(e.name, tuple(e.shape)) for e in expected.tensors}
        theirs = {(e.name, tuple(e.shape)) for e in manifest.tensors}
        diff = sorted(mine ^ theirs)[:4]
        raise SharedWeightsError(
            f"shared weights in {directory} do not match the model's parameters: {diff}"
        )
    flat = torch.from_file(
        str(directory / WEIGHTS), shared=True, size=manifest.numel, dtype=DTYPES[manifest.dtype]
    )
    params = dict(model.named_parameters())
    with torch.no_grad():
        for entry in manifest.tensors:
            param = params[entry.name]
            view = flat[entry.offset : entry.offset + entry.numel].view(entry.shape)
            if copy_in:
                view.copy_(param.data)
            param.data = view
    return manifest


def attach_server(model: nn.Module, directory: Path) -> bool:
    """Server side: map existing shared weights, or create them from ``model`` first.

    Returns True when existing weights were mapped (a restart keeping trained weights).
    """
    existed = read_manifest(directory) is not None
    if not existed:
        write_shared_weights(model, directory)
    map_shared_weights(model, directory, copy_in=False)
    return existed
