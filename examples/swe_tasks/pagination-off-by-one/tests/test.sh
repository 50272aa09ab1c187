#!/bin/bash
# The hidden tests, run by `submit` in the workspace: exit status 0 means reward 1.0.
set -eu
PYTHONPATH="$PWD" python3 -m unittest discover --start-directory "$TESTS_DIR" --pattern 'hidden_*.py' -v
