#!/bin/bash
# open-instruct's layout: the tests are in /tests when submitted; the reward goes to
# /logs/verifier/reward.txt (here: the fraction of checks that pass).
cd /workspace
python3 /tests/test_outputs.py
