import unittest

from inventory import Inventory


def stocked() -> Inventory:
    inventory = Inventory()
    inventory.add("apple", 3, 0.5)
    inventory.add("pear", 2, 1.25)
    return inventory


class HiddenInventoryTest(unittest.TestCase):
    def test_add_and_quantity(self):
        self.assertEqual(stocked().quantity("apple"), 3)

    def test_remove(self):
        inventory = stocked()
        inventory.remove("apple", 2)
        self.assertEqual(inventory.quantity("apple"), 1)

    def test_total_value(self):
        self.assertAlmostEqual(stocked().total_value(), 4.0)

    def test_remove_too_many(self):
        inventory = stocked()
        with self.assertRaises(ValueError):
            inventory.remove("pear", 3)
        self.assertEqual(inventory.quantity("pear"), 2)


if __name__ == "__main__":
    unittest.main()
