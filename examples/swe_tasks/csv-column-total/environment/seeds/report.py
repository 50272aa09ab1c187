"""Print the total of one column of a CSV file: report.py FILE COLUMN."""

import csv
import sys


def column_total(path, column):
    """The sum of the values in ``column`` (by its header name)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return sum(int(row[column]) for row in rows)


if __name__ == "__main__":
    print(column_total(sys.argv[1], sys.argv[2]))
