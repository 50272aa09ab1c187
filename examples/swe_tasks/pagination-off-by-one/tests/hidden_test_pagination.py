import unittest

from pagination import page, page_count


class HiddenPaginationTest(unittest.TestCase):
    def test_counts(self):
        cases = {(0, 3): 0, (1, 3): 1, (3, 3): 1, (4, 3): 2, (10, 3): 4, (10, 10): 1, (11, 10): 2}
        for (total, per_page), expected in cases.items():
            with self.subTest(total=total, per_page=per_page):
                self.assertEqual(page_count(total, per_page), expected)

    def test_every_item_is_on_a_page(self):
        items = list(range(23))
        pages = [page(items, n, 5) for n in range(1, page_count(len(items), 5) + 1)]
        self.assertEqual([x for p in pages for x in p], items)

    def test_invalid_per_page(self):
        with self.assertRaises(ValueError):
            page_count(10, 0)


if __name__ == "__main__":
    unittest.main()
