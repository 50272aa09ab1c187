import unittest

from wordfreq import top_words


class HiddenWordfreqTest(unittest.TestCase):
    def test_case_and_punctuation(self):
        self.assertEqual(top_words("The the, THE! a", 1), [("the", 3)])

    def test_apostrophes_stay(self):
        self.assertEqual(top_words("Don't stop. don't", 1), [("don't", 2)])

    def test_sample(self):
        with open("data/sample.txt", encoding="utf-8") as f:
            top = top_words(f.read(), 3)
        self.assertEqual(top, [("the", 7), ("mat", 3), ("cat", 2)])

    def test_empty(self):
        self.assertEqual(top_words("", 3), [])


if __name__ == "__main__":
    unittest.main()
