#!/bin/bash
# Runs once in the workspace after the seed files are uploaded, before the agent starts:
# here it prepares the sample data the task refers to.
set -eu
mkdir -p data
cat > data/sample.txt <<'TEXT'
The cat sat on the mat. The mat was flat, and the cat was happy.
"Don't move the mat," said the dog. The dog didn't.
TEXT
