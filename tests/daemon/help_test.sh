#!/usr/bin/env bash
# Every trainctl command's --help holds an example that starts with `trainctl <command>` (the
# commands come from `trainctl --help`), and the top-level help holds the exit codes.
# usage: help_test.sh TRAINCTL_BIN
set -u
TRAINCTL=${1:?usage: help_test.sh TRAINCTL_BIN}
fail=0
cmds=$("$TRAINCTL" --help | sed -n '/^Subcommands:/,/^$/p' | awk 'NR > 1 && /^  [a-z]/ {print $1}')
[ -n "$cmds" ] || { echo "FAIL: no subcommands in trainctl --help"; exit 1; }
"$TRAINCTL" --help | grep -q "^Exit codes: 0 ok" || { echo "FAIL: trainctl --help lacks the exit codes"; fail=1; }
for cmd in $cmds; do
  if "$TRAINCTL" "$cmd" --help | grep -Eq "^example: trainctl (-[^ ]+ [^ ]+ )*$cmd( |$)"; then
    echo "ok: trainctl $cmd --help has an example"
  else
    echo "FAIL: trainctl $cmd --help has no 'example: trainctl ... $cmd' line"; fail=1
  fi
done
exit $fail
