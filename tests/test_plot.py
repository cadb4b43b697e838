"""memgate.plot: the curve image (the HTML report's picture, drawn by matplotlib) of the real PTA271 sample
judged against a budget it exceeds; skipped where matplotlib (the optional extra pytest-memgate[plot]) is missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import judged_pta271

from memgate.model import Profile


@pytest.fixture(scope="module")
def sample() -> tuple[Profile, dict[str, Any], list[dict[str, Any]]]:
    return judged_pta271()


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_curve_image(sample: tuple[Profile, dict[str, Any], list[dict[str, Any]]], tmp_path: Path,
                     suffix: str) -> None:
    pytest.importorskip("matplotlib", reason="curve images need the optional extra pytest-memgate[plot]")
    from memgate.plot import write_curve_image

    profile, entry, outcomes = sample
    target = write_curve_image(profile, entry, tmp_path / f"curves{suffix}", outcomes)
    data = target.read_bytes()
    if suffix == ".png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        from PIL import Image

        pixels = np.asarray(Image.open(target).convert("RGB")).reshape(-1, 3).astype(int)
        assert (np.abs(pixels - [0x1F, 0x6F, 0xB4]).sum(axis=1) < 40).sum() > 1000
    else:
        text = data.decode()
        assert "<svg" in text and "peak 10.04 GiB (10782243840 B) · step 13" in text
        assert "budget train-step peak_allocated ≤ 10.00 GiB EXCEEDED" in text


def test_curve_image_rejects_unknown_suffix(sample: tuple[Profile, dict[str, Any], list[dict[str, Any]]],
                                            tmp_path: Path) -> None:
    from memgate.errors import ConfigError
    from memgate.plot import write_curve_image

    profile, entry, _ = sample
    with pytest.raises(ConfigError, match=r"expected a file name ending in \.png or \.svg"):
        write_curve_image(profile, entry, tmp_path / "curves.jpg")
    assert not (tmp_path / "curves.jpg").exists()


def test_one_device_entry_is_one_panel_without_budgets(sample: tuple[Profile, dict[str, Any], list[dict[str, Any]]],
                                                      tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="curve images need the optional extra pytest-memgate[plot]")
    from memgate.plot import write_curve_image

    profile, entry, _ = sample
    text = write_curve_image(profile, entry["devices"][0], tmp_path / "one.svg").read_text()
    assert "peak 10.04 GiB (10782243840 B) · step 13" in text  # the peak at its exact value
    assert "budget" not in text  # no outcomes given
    with pytest.raises(TypeError, match="metrics_entry must be a report entry dict, got list"):
        write_curve_image(profile, [entry], tmp_path / "bad.svg")
