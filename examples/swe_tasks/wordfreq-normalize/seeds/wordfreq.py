"""Word frequencies of a text."""

import sys
from collections import Counter


def words(text: str) -> list[str]:
    """The words of ``text``, in order."""
    return text.split()


def top_words(text: str, n: int) -> list[tuple[str, int]]:
    """The ``n`` most frequent words of ``text`` and their counts, most frequent first."""
    return Counter(words(text)).most_common(n)


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        for word, count in top_words(f.read(), 5):
            print(f"{count:4} {word}")
