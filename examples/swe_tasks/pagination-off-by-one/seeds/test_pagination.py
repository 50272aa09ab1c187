import unittest

from pagination import page, page_count


class PageCountTest(unittest.TestCase):
    def test_full_pages(self):
        self.assertEqual(page_count(9, 3), 3)

    def test_partial_last_page(self):
        self.assertEqual(page_count(10, 3), 4)

    def test_last_page_items(self):
        self.assertEqual(page(list(range(10)), 4, 3), [9])


if __name__ == "__main__":
    unittest.main()
