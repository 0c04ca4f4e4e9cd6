"""The chat page in a headless Chromium (the `browser` fixture is in tests/conftest.py)."""

import contextlib
import shutil
import time

from edgespec.runtime.apps.chat_page import HEADLESS_CHROMIUM
from helpers.serving import KEY

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM_FLAGS = (*HEADLESS_CHROMIUM, "--window-size=1100,800")
WAIT_S = 30  # the longest any page state is waited for


@contextlib.contextmanager
def chromium(*flags: str, page_load_s: float = WAIT_S):
    """A headless Chromium driven by selenium, with its own profile and these extra flags (pytest
    skips where either is missing)."""
    import tempfile

    import pytest

    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium not installed (pip install -e '.[dev]')")
    from selenium.webdriver.chrome.service import Service

    if not CHROMIUM or not CHROMEDRIVER:
        pytest.skip("no headless Chromium here: apt-get install -y chromium chromium-driver (.ci/run does)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.TemporaryDirectory(prefix="edgespec-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile.name}", *flags):
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))  # a given driver: nothing downloaded
    driver.set_page_load_timeout(page_load_s)
    try:
        yield driver
    finally:
        driver.quit()
        profile.cleanup()


# ---- in a real browser ----------------------------------------------------------------------------------


def until(cond, what: str, timeout: float = WAIT_S):
    """Poll cond() until it is truthy (bounded); its value."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(Exception):  # the page may be mid-update
            if v := cond():
                return v
        time.sleep(0.05)
    raise AssertionError(f"waited {timeout} s for {what}")


class Page:
    """The chat page as a person uses it: fields, buttons and what is shown."""

    def __init__(self, driver, url: str, key: str = KEY) -> None:
        from selenium.webdriver.common.by import By

        self.d, self.By = driver, By
        driver.get(url + "/")
        driver.execute_script("sessionStorage.clear()")
        self.set_key(key)
        if key == KEY:
            until(lambda: self.text("model") == "tiny", "the model name")

    def el(self, id_: str):
        return self.d.find_element(self.By.ID, id_)

    def text(self, id_: str) -> str:
        return self.el(id_).text

    def all(self, css: str):
        return self.d.find_elements(self.By.CSS_SELECTOR, css)

    def set_key(self, key: str) -> None:
        box = self.el("api-key")
        box.clear()
        box.send_keys(key + "\t")  # leaving the field reloads the settings with it

    def fill(self, id_: str, value) -> None:
        box = self.el(id_)
        box.clear()
        box.send_keys(str(value))

    def choose(self, id_: str, value: str) -> None:
        from selenium.webdriver.support.ui import Select

        Select(self.el(id_)).select_by_value(value)

    def options(self, id_: str) -> list[str]:
        return [o.get_attribute("value") for o in self.all(f"#{id_} option")]

    def busy(self) -> bool:
        return self.el("stop").is_enabled()

    def send(self, prompt: str) -> None:
        from selenium.webdriver.common.keys import Keys

        box = self.el("prompt")
        box.send_keys(prompt)
        box.send_keys(Keys.ENTER)

    def answers(self):
        return self.all(".msg.assistant")

    def ask(self, prompt: str):
        """Send and wait until the answer is complete; its element."""
        n = len(self.answers())
        self.send(prompt)
        until(lambda: len(self.answers()) == n + 1, "the answer to appear")
        until(lambda: not self.busy(), "the answer to finish")
        return self.answers()[-1]
