"""Check report.column_total; write the fraction of checks passed to the reward file."""

import sys

sys.path.insert(0, "/workspace")

CHECKS = [
    ("data/units.csv", "units", 12),
    ("data/sales.csv", "amount", 60.5),
]

passed = 0
for path, column, expected in CHECKS:
    try:
        from report import column_total

        got = column_total(path, column)
        ok = abs(got - expected) < 1e-9
    except Exception as exc:  # the model's code may raise anything
        got, ok = f"{type(exc).__name__}: {exc}", False
    passed += ok
    print(f"{'PASS' if ok else 'FAIL'} column_total({path!r}, {column!r}) = {got} (expected {expected})")

reward = passed / len(CHECKS)
with open("/logs/verifier/reward.txt", "w") as f:
    f.write(f"{reward}\n")
print(f"{passed}/{len(CHECKS)} checks passed")
sys.exit(0 if passed == len(CHECKS) else 1)
