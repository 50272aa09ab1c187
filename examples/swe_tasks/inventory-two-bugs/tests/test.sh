#!/bin/bash
# The hidden tests, run by `submit` in the workspace. Partial credit: grade.py writes the
# fraction of tests that pass to $REWARD_FILE, which the environment reads as the reward.
set -eu
PYTHONPATH="$PWD" python3 "$TESTS_DIR/grade.py" "$TESTS_DIR" "$REWARD_FILE"
