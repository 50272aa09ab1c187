"""Run the hidden tests; write the fraction that passed to the reward file (argv[2])."""

import sys
import unittest

suite = unittest.defaultTestLoader.discover(sys.argv[1], pattern="hidden_*.py")
result = unittest.TextTestRunner(verbosity=2).run(suite)
failed = len(result.failures) + len(result.errors)
reward = (result.testsRun - failed) / result.testsRun if result.testsRun else 0.0
with open(sys.argv[2], "w") as f:
    f.write(f"{reward:.4f}\n")
print(f"{result.testsRun - failed}/{result.testsRun} tests passed: reward {reward:.2f}")
sys.exit(0 if result.wasSuccessful() else 1)
