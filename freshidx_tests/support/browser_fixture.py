"""A real browser on the Dagster UI: Debian's Chromium driven by Playwright, and the UI steps a user takes.

Playwright cannot download its own browsers here, so it always launches ``/usr/bin/chromium``
(Debian packages ``chromium`` and ``chromium-driver``; ``scripts/bootstrap.sh`` installs them when apt
is usable) with a fresh profile. Without the background-networking flags Chromium hangs on refused
connections on a machine without internet access.

:class:`DagsterUi` reads the UI the way a person does: roles and visible text (buttons, links, the
toast after a launch, the status next to a check), rarely structure and never CSS classes. Every
step runs inside :meth:`DagsterUi.step`, which saves a screenshot when the step fails and puts its
path in the assertion message.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from freshidx_tests.support.polling import poll_until

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page

__all__ = [
    "CHROMIUM",
    "CHROMIUM_ARGS",
    "CheckView",
    "DagsterUi",
    "chromium_page",
    "unavailable_reason",
]

CHROMIUM = Path("/usr/bin/chromium")
#: --headless/--no-sandbox/--disable-gpu: a container without a display or user namespaces; the rest keep
#: Chromium from calling home (with no network it otherwise hangs on refused connections).
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
#: Playwright's wait for one element or navigation (ms). The box is a busy 2-core machine running Spark
#: beside the UI; a page of the Dagster UI has been seen to take over 20 s to render there.
ACTION_TIMEOUT_MS = 90_000

#: The run status shown next to a run's id (Dagster's RunStatusTag), by run status.
RUN_STATUS_LABELS = {
    "SUCCESS": "Success", "FAILURE": "Failure", "CANCELED": "Canceled", "CANCELING": "Canceling",
    "STARTED": "Started", "STARTING": "Starting", "QUEUED": "Queued", "NOT_STARTED": "Not started",
    "SUSPENDED": "Suspended", "MANAGED": "Managed",
}
_RUN_STATUS_LABEL = re.compile(f"^({'|'.join(RUN_STATUS_LABELS.values())})$")
_CHECK_LIST_STATUS = re.compile(r"(Not evaluated|Failed|In progress|Skipped|Succeeded)")
_RUN_LINK = re.compile(r"^run [0-9a-f]{8}$")
_RUN_HREF = re.compile(r"/runs/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")


def unavailable_reason() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    if importlib.util.find_spec("playwright") is None:
        return "the Python package 'playwright' is not installed (pip install -e '.[dev]')"
    if not CHROMIUM.exists():
        return (f"{CHROMIUM} is missing: install Debian's chromium and chromium-driver "
                "(scripts/bootstrap.sh does when apt is usable; Playwright cannot download browsers here)")
    return None


@contextlib.contextmanager
def chromium_page(profile_dir: Path, viewport: tuple[int, int] = (1600, 1000)) -> Iterator[Page]:
    """One page of a headless Debian Chromium with a fresh profile in ``profile_dir``; closed on exit."""
    from playwright.sync_api import sync_playwright

    profile_dir.mkdir(parents=True, exist_ok=False)  # fresh: never a profile left by another run
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile_dir), executable_path=str(CHROMIUM), headless=True, args=list(CHROMIUM_ARGS),
            viewport={"width": viewport[0], "height": viewport[1]},
        )
        try:
            context.set_default_timeout(ACTION_TIMEOUT_MS)
            context.set_default_navigation_timeout(ACTION_TIMEOUT_MS)
            page = context.pages[0] if context.pages else context.new_page()
            yield page
        finally:
            context.close()


@dataclass(frozen=True)
class CheckView:
    """One asset check as the asset's Checks tab shows it (``?view=checks&checkDetail=<name>``)."""

    list_status: str  # under the name in the list: Succeeded / Failed / Skipped / In progress / Not evaluated
    list_icon: str | None  # the icon before the name: check_circle, cancel (error), warning_outline (warn), …
    result_label: str  # "Evaluation result" of the latest execution: Passed / Failed / Running / Not evaluated
    result_icon: str | None
    paragraphs: tuple[str, ...]  # the check's description, then the latest evaluation's description


class DagsterUi:
    """The Dagster UI at ``base_url`` in ``page``; failing steps leave screenshots in ``shots``."""

    def __init__(self, page: Page, base_url: str, shots: Path) -> None:
        self.page = page
        self.base_url = base_url.rstrip("/")
        self.shots = shots
        self._shot_seq = 0

    # ------------------------------------------------------------------ plumbing

    def screenshot(self, name: str) -> Path:
        self._shot_seq += 1
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{self._shot_seq:02d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.png"
        try:
            self.page.screenshot(path=str(path), full_page=True)
        except Exception as exc:  # a crashed page still deserves a message, not a second error
            return Path(f"{path} (screenshot failed: {type(exc).__name__}: {exc})")
        return path

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A UI step: any failure inside becomes an AssertionError naming the step, the URL and a screenshot."""
        try:
            yield
        except Exception as exc:
            shot = self.screenshot(name)
            raise AssertionError(
                f"UI step {name!r} failed at {self.page.url}: {type(exc).__name__}: {exc}\nscreenshot: {shot}"
            ) from exc

    def goto(self, path: str) -> None:
        self.page.goto(self.base_url + path, wait_until="domcontentloaded")

    def park(self) -> None:
        """Leave the UI for a blank page while the test waits on GraphQL: an open Dagster page keeps
        polling and re-rendering (a running run's page streams its logs), CPU that Chromium and the
        webserver would take from the runs being waited for on the busy 2-core box."""
        self.page.goto("about:blank")

    # ------------------------------------------------------------------ runs

    def materialize(self, asset: str) -> str:
        """Click the asset page's Materialize button like a user; return the launched run's id.

        The run is launched directly for an unpartitioned asset whose config has defaults; if Dagster
        opens the launchpad instead (a partition choice or required config), launch from there.
        """
        page = self.page
        self.goto(f"/assets/{asset}")
        page.get_by_role("button", name=re.compile(r"^(materialization )?Materialize$")).click()
        toast_link = page.get_by_role("listitem").filter(has_text="Launched run").get_by_role("link", name="View")
        launch = page.get_by_role("button", name="Launch run")
        clicked: list[bool] = []

        def launched() -> bool:
            if toast_link.count():
                return True
            if not clicked and launch.count() and launch.first.is_visible():  # the launchpad opened instead
                launch.first.click()
                clicked.append(True)  # once: a second click would launch a second run
            return False

        poll_until(launched, timeout=ACTION_TIMEOUT_MS / 1000, interval=0.25,
                   what=f"a 'Launched run' notification after clicking Materialize on {asset}")
        toast_link.first.wait_for(state="attached")
        href = toast_link.first.get_attribute("href") or ""
        found = _RUN_HREF.search(href)
        if not found:
            raise AssertionError(f"the 'Launched run' notification links to {href!r}, not to a run")
        return found.group(1)

    def run_status_label(self, run_id: str) -> str:
        """Open the run's page; return the status shown next to its id (Success, Failure, Started, …)."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        page = self.page
        self.goto(f"/runs/{run_id}")
        # The header: "Runs / <id>", or on a backfill's run "Runs / <backfill> / <id>" with the id a bare text
        # node of the heading, so no element's text *starts* with it: the short id at the start or after a
        # "/" (anchored at the start only, a backfill run's page was never found: the suite's intermittent
        # "no header for 90 s" whose screenshots showed the header).
        header = page.get_by_text(re.compile(r"(^|/\s*)" + re.escape(run_id[:8]))).filter(visible=True).first
        try:
            header.wait_for(timeout=ACTION_TIMEOUT_MS / 2)
        except PlaywrightTimeout:
            self.goto(f"/runs/{run_id}")  # reload once, as a user would, and give it the full wait
            header.wait_for()
        label = page.get_by_text(_RUN_STATUS_LABEL).filter(visible=True).first  # the tag right after the id
        label.wait_for()
        return label.inner_text().strip()

    def run_launched_by(self) -> str | None:
        """On an open run page of a sensor's or schedule's run: the name shown after "Launched by"."""
        by = self.page.get_by_text(re.compile(r"^Launched by")).first
        by.wait_for()
        return by.locator("xpath=..").get_by_title(re.compile(".")).first.get_attribute("title")

    def run_ids_in_list(self, tag: tuple[str, str] | None = None, path: str = "/runs",
                        query: dict[str, str] | None = None) -> list[str]:
        """Run ids linked from a runs table: the Runs page filtered by ``tag`` (the filter a user picks
        from the Filter menu, kept in the URL), or another page's table (a backfill's Runs tab)."""
        page = self.page
        params: list[tuple[str, str]] = list((query or {}).items())
        if tag:
            params.append(("q[]", f"tag:{tag[0]}={tag[1]}"))
        self.goto(path + (f"?{urlencode(params)}" if params else ""))
        if tag:
            page.get_by_text(f"Tag is {tag[0]}={tag[1]}").first.wait_for()  # the filter is applied
        links = page.get_by_role("link", name=_RUN_LINK)
        # The table's header shows before its rows: wait for a row or the empty state.
        links.or_(page.get_by_text(re.compile(r"^No (matching )?runs"))).first.wait_for()
        ids: list[str] = []
        for i in range(links.count()):
            found = _RUN_HREF.search(links.nth(i).get_attribute("href") or "")
            if found and found.group(1) not in ids:
                ids.append(found.group(1))
        return ids

    # ------------------------------------------------------------------ backfills

    def launch_backfill(self, asset: str, selection: str) -> tuple[str, str]:
        """From the asset's Partitions view: Materialize…, type the partition ``selection`` (e.g.
        ``[2026-11-24-02:00...2026-11-24-04:00]``), Launch backfill. Returns (backfill id, the dialog's
        note on how it splits the backfill into runs)."""
        page = self.page
        self.goto(f"/assets/{asset}?view=partitions")
        page.get_by_role("tab", name="Partitions", selected=True).wait_for()
        page.get_by_role("button", name=re.compile(r"Materialize…$")).click()
        dialog = page.get_by_role("dialog").filter(has_text=f"Launch runs to materialize {asset}")
        box = dialog.get_by_role("textbox").first
        box.click()
        box.fill(selection)
        box.press("Enter")
        launch = dialog.get_by_role("button", name="Launch backfill")
        _wait_enabled(launch)
        note = dialog.get_by_text(re.compile(r"Backfills? in .*run")).first.inner_text()
        launch.click()
        toast = page.get_by_role("listitem").filter(has_text="Created backfill").first
        toast.wait_for()
        found = re.search(r"Created backfill\s+(\S+)", toast.inner_text())
        if not found:
            raise AssertionError(f"no backfill id in the notification {toast.inner_text()!r}")
        return found.group(1), note

    def backfill_status_label(self, backfill_id: str) -> str:
        """The status tag of the backfill's page (In progress, Succeeded, Completed, Failed, …)."""
        page = self.page
        self.goto(f"/runs/b/{backfill_id}")
        status = page.get_by_text("Status", exact=True).first
        status.wait_for()
        text = status.locator("xpath=..").inner_text()
        return text.replace("Status", "", 1).strip()

    def backfill_run_ids(self, backfill_id: str) -> list[str]:
        """Run ids listed on the backfill page's Runs tab."""
        return self.run_ids_in_list(path=f"/runs/b/{backfill_id}", query={"tab": "runs"})

    # ------------------------------------------------------------------ asset checks

    def open_checks(self, asset: str, check: str | None = None) -> None:
        query = {"view": "checks", **({"checkDetail": check} if check else {})}
        self.goto(f"/assets/{asset}?{urlencode(query)}")
        self.page.get_by_role("tab", name="Checks", selected=True).wait_for()

    def checks_count(self, asset: str) -> int:
        """How many checks the asset's Checks tab says it has ("Checks (N)"; 0 when it says none)."""
        self.open_checks(asset)
        page = self.page
        empty = page.get_by_text("No checks defined for this asset")
        header = page.get_by_text(re.compile(r"^Checks \(\d+\)$"))
        empty.or_(header).first.wait_for()
        if empty.count():
            return 0
        return int(re.sub(r"\D", "", header.first.inner_text()))

    def check_view(self, asset: str, check: str) -> CheckView:
        """Select ``check`` on the asset's Checks tab; read its list entry and its overview."""
        page = self.page
        self.open_checks(asset, check)
        title = page.get_by_title(check, exact=True).first
        title.wait_for()
        # The innermost block holding the check's name and its status word is its list entry.
        entry = page.locator("div", has=page.get_by_title(check, exact=True)).filter(has_text=_CHECK_LIST_STATUS).last
        entry_lines = [ln.strip() for ln in entry.inner_text().splitlines() if ln.strip()]
        result = page.get_by_text("Evaluation result", exact=True).locator("xpath=following-sibling::*[1]")
        result.wait_for()
        paragraphs = tuple(" ".join(p.split()) for p in page.get_by_role("paragraph").all_inner_texts())
        return CheckView(
            list_status=entry_lines[-1] if entry_lines else "",
            list_icon=_icon(entry),
            result_label=" ".join(result.inner_text().split()),
            result_icon=_icon(result),
            paragraphs=paragraphs,
        )


def _icon(scope: Locator) -> str | None:
    icons = scope.get_by_role("img")
    return icons.first.get_attribute("aria-label") if icons.count() else None


def _wait_enabled(button: Locator) -> None:
    button.wait_for()
    poll_until(button.is_enabled, timeout=ACTION_TIMEOUT_MS / 1000, interval=0.25, what=f"{button} enabled")
