"""``grpo-tui report`` on a run includes the step timeline, and a headless Chromium draws it
(the swimlanes' phase colours are on the screenshot)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
from recorded_rollouts import STEPS, step_start, write_recorded_rollouts
from required_tools import require

from grpo_tui.timeline_svg import COLORS


def recorded_run(run_dir: Path) -> Path:
    write_recorded_rollouts(run_dir)
    with (run_dir / "metrics.jsonl").open("w") as handle:
        for step in range(1, STEPS + 1):
            data = {"loss": 1 / step, "reward/mean": step / STEPS, "training_steps": STEPS}
            record = {
                "type": "metrics",
                "process": "trainer",
                "step": step,
                "t": step_start(step) + 2,
                "data": data,
            }
            handle.write(json.dumps(record) + "\n")
    return run_dir


def test_the_report_of_a_run_has_its_timeline(tmp_path: Path) -> None:
    run = recorded_run(tmp_path / "run")
    done = subprocess.run(
        [sys.executable, "-m", "grpo_tui", "report", str(run)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    page = (run / "report.html").read_text()
    assert "<h2>Step timeline</h2>" in page and f"{STEPS} steps, 4 lanes" in page
    for step in range(STEPS - 4, STEPS + 1):
        assert f">step {step}</text>" in page  # the last five steps' swimlanes
    assert page.count(f'fill="{COLORS["forward_backward"]}"') >= 2 * 5 + STEPS  # lanes, bars
    assert "<th>forward+backward</th>" in page and "<td class=id>env.toy</td>" in page


def read_png(path: Path) -> np.ndarray:
    """An 8-bit RGB(A), non-interlaced PNG (what Chromium writes) as ``[h, w, channels]``."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, idat, header = 8, b"", b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind, body = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        offset += 12 + length
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0
    channels = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * channels)
    out = np.zeros((height, width * channels), np.int32)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        up = out[y - 1] if y else np.zeros_like(line)
        if kind in (0, 2):
            out[y] = (line + (up if kind == 2 else 0)) % 256
            continue
        row = np.zeros_like(line)
        for x in range(len(line)):
            left = row[x - channels] if x >= channels else 0
            corner = up[x - channels] if x >= channels else 0
            if kind == 1:
                predicted = left
            elif kind == 3:
                predicted = (left + up[x]) // 2
            else:
                p = left + up[x] - corner
                pa, pb, pc = abs(p - left), abs(p - up[x]), abs(p - corner)
                predicted = left if pa <= pb and pa <= pc else up[x] if pb <= pc else corner
            row[x] = (line[x] + predicted) % 256
        out[y] = row
    return out.reshape(height, width, channels)[:, :, :3].astype(np.uint8)


def test_headless_chromium_draws_the_timeline(tmp_path: Path) -> None:
    require("chromium")
    run = recorded_run(tmp_path / "run")
    subprocess.run(
        [sys.executable, "-m", "grpo_tui", "report", str(run)], check=True, capture_output=True
    )
    shot = tmp_path / "report.png"
    done = subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1000,2200",
            (run / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    pixels = read_png(shot).reshape(-1, 3)
    for phase in ("forward_backward", "generate", "wait", "transfer"):
        rgb = np.array([int(COLORS[phase][i : i + 2], 16) for i in (1, 3, 5)])
        drawn = int((np.abs(pixels.astype(int) - rgb).max(axis=1) <= 2).sum())
        assert drawn > 500, f"{phase}: {drawn} pixels of {COLORS[phase]}"
