"""Shared for tests/report: one headless Chromium for every browser test, and the results they draw.

The browser is Debian's chromium with its chromium-driver, driven by selenium; without them the browser
tests skip with the reason (and fail under QCONVERT_REQUIRE_ENGINES=1, as .ci/run sets)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from report.report_support import DIGITS, DIGITS_INPUTS, DIGITS_QDQ

from qconvert.cli import main

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from conftest import REQUIRE_ENGINES_ENV, engines_required, require_module

    require_module("selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = next((found for name in CHROMIUM if (found := shutil.which(name))), None)
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        reason = "headless Chromium needs chromium and chromedriver (apt-get install chromium-driver)"
        if engines_required():
            pytest.fail(f"{reason}, and {REQUIRE_ENGINES_ENV}=1 requires every engine", pytrace=False)
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1280,1800")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="session")
def plotly() -> None:
    """Pages draw with plotly (the `report` extra): without it, each test writing one skips and says so."""
    from conftest import require_module

    require_module("plotly")


@pytest.fixture(scope="session")
def results(tmp_path_factory: pytest.TempPathFactory, plotly: None) -> dict[str, Path]:
    """A check and a calibrate JSON result of the digits CNN, and the model files they came from."""
    folder = tmp_path_factory.mktemp("results")
    check_json, calibrate_json = folder / "check.json", folder / "calibrate.json"
    code = main(
        [
            "check", str(DIGITS_QDQ), "--data", str(DIGITS_INPUTS), "--quiet",
            "--json", str(check_json), "--report", str(folder / "check.html"),
            "--model-explorer", str(folder / "explorer.json"),
        ]
    )  # fmt: skip
    assert code == 0
    code = main(
        [
            "calibrate", str(DIGITS), "--data", str(DIGITS_INPUTS), "--method", "entropy", "--quiet",
            "-o", str(folder / "digits.qdq.onnx"), "--json", str(calibrate_json),
            "--report", str(folder / "calibrate.html"), "--worst-tensors", "5",
        ]
    )  # fmt: skip
    assert code == 0
    return {
        "check": check_json,
        "calibrate": calibrate_json,
        "check_html": folder / "check.html",
        "calibrate_html": folder / "calibrate.html",
        "explorer": folder / "explorer.json",
        "folder": folder,
    }
