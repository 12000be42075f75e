from __future__ import annotations

import pytest

from mistill.world.inventory import Inventory, demo_inventory
from mistill.world.types import Code


@pytest.fixture(scope="session")
def demo_inv() -> Inventory:
    return demo_inventory(200, 0)


@pytest.fixture()
def small_inv() -> Inventory:
    """Two categories with siblings, in a hand-fixed shared order."""
    return Inventory([
        Code("N18.9", "chronic kidney disease unspecified"),
        Code("E11.9", "type 2 diabetes mellitus without complications"),
        Code("N18.1", "chronic kidney disease stage 1"),
        Code("I10", "essential primary hypertension"),
        Code("E11.65", "type 2 diabetes mellitus with hyperglycemia"),
    ])
