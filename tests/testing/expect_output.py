"""Runs a command and passes only if it exits 0 and its output (stdout and
stderr together) matches a regular expression. CTest's
PASS_REGULAR_EXPRESSION alone ignores the exit code, so a smoke run that
printed its line and then crashed would pass.

  expect_output.py REGEX -- COMMAND [ARGS...]
"""
import re
import subprocess
import sys

if len(sys.argv) < 4 or sys.argv[2] != "--":
    sys.exit("usage: expect_output.py REGEX -- COMMAND [ARGS...]")
pattern, command = sys.argv[1], sys.argv[3:]
run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
sys.stdout.write(run.stdout)
if run.returncode != 0:
    sys.exit(f"expect_output: {command[0]} exited with status {run.returncode}")
if re.search(pattern, run.stdout) is None:
    sys.exit(f"expect_output: the output has no match for /{pattern}/")
print(f"expect_output: exit 0 and /{pattern}/ found")
