"""Which tests must share a pytest-xdist worker, and a scheduler that keeps them together.

A test's group (`group_of`): the demo server's tests form one group (one demo server per run: a
second one would double the memory and the CPU it takes, and the tests that check the server's
idle counters must not see another worker's calls); a test that uses a module- or class-scoped
fixture (an in-process engine, a server of its own) shares its module's group, so that fixture
starts once; every other test has none and goes to whichever worker is free. A module whose
shared fixture also serves demo-server tests joins the demo group whole.

pytest-xdist's own `--dist loadgroup` tags a grouped test by rewriting its node id, which pytest 9
no longer reads (a node's id became structured), so its groups silently fall apart. Here node ids
stay as they are: each worker writes the group of every test it collected to a file the
controller names, and under `--dist loadgroup` the controller schedules with xdist's scope
scheduler, a group being one scope.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

DEMO_GROUP = "demo-server"
# Fixtures that reach the session's one demo server.
DEMO_FIXTURES = frozenset({"demo_server", "client", "channel"})
_WORKERINPUT_KEY = "scoring_worker_groups"
_GROUPS_FILE = pytest.StashKey[Path]()


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def _shares_module_fixtures(item: pytest.Item) -> bool:
    definitions = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]
    return any(
        definitions[name][-1].scope in ("module", "class", "package")
        for name in getattr(item, "fixturenames", ()) if name in definitions
    )


def groups_of(items: list[pytest.Item]) -> dict[str, str]:
    """The group of every test that has one, by node id."""
    groups: dict[str, str] = {}
    for item in items:
        if DEMO_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            groups[item.nodeid] = DEMO_GROUP
        elif _shares_module_fixtures(item):
            groups[item.nodeid] = _module(item)
    with_demo = {
        _module(item) for item in items if groups.get(item.nodeid) == DEMO_GROUP and _shares_module_fixtures(item)
    }
    return {nodeid: DEMO_GROUP if group in with_demo else group for nodeid, group in groups.items()}


def pytest_configure(config: pytest.Config) -> None:
    """The controller of a `--dist loadgroup` run names the file its workers write the groups to."""
    if not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist") and _grouped(config):
        handle, path = tempfile.mkstemp(prefix="pytest-worker-groups-", suffix=".json")
        os.close(handle)
        config.stash[_GROUPS_FILE] = Path(path)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _GROUPS_FILE in config.stash:
        config.stash[_GROUPS_FILE].unlink(missing_ok=True)


def _grouped(config: pytest.Config) -> bool:
    return config.getvalue("dist") == "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    if _GROUPS_FILE in node.config.stash:
        node.workerinput[_WORKERINPUT_KEY] = str(node.config.stash[_GROUPS_FILE])


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker, before it reports its collection: every worker writes the same map, each
    through a rename, so the controller reads a whole one whichever came last."""
    target = getattr(config, "workerinput", {}).get(_WORKERINPUT_KEY)
    if target:
        partial = Path(f"{target}.{config.workerinput['workerid']}")  # type: ignore[attr-defined]
        partial.write_text(json.dumps(groups_of(items)))
        os.replace(partial, target)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if not _grouped(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's scope scheduler with a test's group as its scope (else the test alone)."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # read once every worker has collected (and written)
                self._groups = json.loads(config.stash[_GROUPS_FILE].read_text())
            return self._groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)
