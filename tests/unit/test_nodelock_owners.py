"""`NodeMutexes`' recorded lock owners stay bounded when the device plugin, not the extender, releases
the lock (the normal path): kept for the lock's expiry, then dropped."""

from __future__ import annotations

from typing import Any

from hami.annotations import NODE_LOCK
from hami.nodelock import NodeMutexes, lock_node


class Nodes:
    """The two calls `lock_node` makes on an unlocked node, over a dict of Node objects."""

    def __init__(self, count: int) -> None:
        self.nodes = {
            f"n{i}": {"metadata": {"name": f"n{i}", "resourceVersion": "1", "annotations": {}}}
            for i in range(count)
        }

    def get_node(self, name: str) -> dict[str, Any] | None:
        return self.nodes.get(name)

    def patch_node_annotations(
        self, name: str, patch: dict[str, str | None], *, resource_version: str
    ) -> None:
        meta = self.nodes[name]["metadata"]
        assert meta["resourceVersion"] == resource_version
        for key, value in patch.items():
            if value is None:
                meta["annotations"].pop(key, None)
            else:
                meta["annotations"][key] = value
        meta["resourceVersion"] = str(int(resource_version) + 1)

    def device_plugin_releases(self, name: str) -> None:
        self.patch_node_annotations(
            name, {NODE_LOCK: None}, resource_version=self.nodes[name]["metadata"]["resourceVersion"]
        )


def test_owners_released_by_the_device_plugin_are_dropped_after_the_expiry() -> None:
    now = [1000.0]
    mutexes = NodeMutexes(clock=lambda: now[0])
    client = Nodes(500)
    for i in range(500):
        lock_node(
            client, f"n{i}", namespace="ml", pod_name=f"p{i}", uid=f"u{i}", expiry_s=300, mutexes=mutexes
        )
        client.device_plugin_releases(f"n{i}")  # Allocate done: no forget_owner reaches the extender
    assert mutexes.recorded_owners() == 500
    assert mutexes.owner_uid("n7", "ml", "p7") == "u7"
    assert len(mutexes) == 0  # the per-node mutexes were already gone
    now[0] += 301
    assert mutexes.owner_uid("n7", "ml", "p7") is None  # past the expiry the UID decides nothing
    lock_node(client, "n0", namespace="ml", pod_name="next", uid="u-next", expiry_s=300, mutexes=mutexes)
    assert mutexes.recorded_owners() == 1
    assert mutexes.owner_uid("n0", "ml", "next") == "u-next"


def test_a_node_locked_again_is_remembered_from_its_latest_lock() -> None:
    now = [0.0]
    mutexes = NodeMutexes(clock=lambda: now[0])
    mutexes.record_owner("n0", "ml", "a", "ua", expiry_s=300)  # until 300
    now[0] = 100
    mutexes.record_owner("n1", "ml", "b", "ub", expiry_s=300)  # until 400
    now[0] = 200
    mutexes.record_owner("n0", "ml", "c", "uc", expiry_s=300)  # until 500, now the newest entry
    now[0] = 450
    mutexes.record_owner("n2", "ml", "d", "ud", expiry_s=300)
    assert mutexes.recorded_owners() == 2  # n1 dropped; n0 kept by its second lock
    assert (mutexes.owner_uid("n0", "ml", "c"), mutexes.owner_uid("n1", "ml", "b")) == ("uc", None)
    mutexes.record_owner("n2", "ml", "d", None)  # locked without a UID: nothing to remember
    assert mutexes.recorded_owners() == 1
