#!/bin/bash
# Runs once in /workspace after the seeds: the units file the tests read as well.
set -eu
cd /workspace
printf 'day,units\nmon,3\ntue,4\nwed,5\n' > data/units.csv
