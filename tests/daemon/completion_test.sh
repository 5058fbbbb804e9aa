#!/usr/bin/env bash
# The shell completions (client/trainctl/completion/) against trainctl itself: their command lists
# equal the subcommands of `trainctl --help`, every long flag of `trainctl CMD --help` is offered
# for CMD, and the bash completion completes commands, flags, -o values and job ids (from a stand-in
# trainctl that prints a job list). The zsh file must parse and list the same commands.
# usage: completion_test.sh TRAINCTL_BIN COMPLETION_DIR
set -u
TRAINCTL=${1:?usage: completion_test.sh TRAINCTL_BIN COMPLETION_DIR}
DIR=${2:?usage: completion_test.sh TRAINCTL_BIN COMPLETION_DIR}
fail=0
check() {  # what, got, want
  if [ "$2" != "$3" ]; then echo "FAIL: $1: got [$2], want [$3]"; fail=1; else echo "ok: $1"; fi
}
sorted() { tr ' ' '\n' | grep -v '^$' | sort -u | tr '\n' ' '; }

help_cmds=$("$TRAINCTL" --help | sed -n '/^Subcommands:/,/^$/p' | awk 'NR > 1 && /^  [a-z]/ {print $1}' | sorted)
[ -n "$help_cmds" ] || { echo "FAIL: no subcommands in trainctl --help"; exit 1; }

# ---- bash ----
# shellcheck disable=SC1091
source "$DIR/trainctl.bash"
check "bash command list = trainctl --help" "$(echo "$_trainctl_commands" | sorted)" "$help_cmds"
for cmd in $help_cmds; do
  want=$("$TRAINCTL" "$cmd" --help 2>&1 | sed -n '/^Options:/,/^$/p' | grep -o -- '--[a-z][a-z-]*' | sorted)
  have=$(_trainctl_flags_of "$cmd" | sorted)
  missing=$(comm -23 <(echo "$want" | tr ' ' '\n' | grep -v '^$') <(echo "$have" | tr ' ' '\n' | grep -v '^$') | tr '\n' ' ')
  check "bash flags of $cmd cover trainctl $cmd --help" "$missing" ""
done
complete_line() {  # words... ; the last word is the one being completed
  COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=()
  _trainctl
  echo "${COMPREPLY[*]}" | sorted
}
check "trainctl st<TAB>" "$(complete_line trainctl st)" "status "
check "trainctl -o <TAB>" "$(complete_line trainctl -o '')" "json text "
check "trainctl --addr h:1 sub<TAB>" "$(complete_line trainctl --addr h:1 sub)" "submit "
check "trainctl submit --w<TAB>" "$(complete_line trainctl submit --w)" "--wait "
check "trainctl logs -<TAB>" "$(complete_line trainctl logs -)" "--follow --help -f -h "
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cat > "$work/trainctl" <<'STUB'
#!/bin/sh
echo '{"jobs": [{"id": "job-7f3a", "state": "RUNNING"}, {"id": "job-9b21", "state": "QUEUED"}]}'
STUB
chmod +x "$work/trainctl"
check "trainctl status job-<TAB> (ids from list -o json)" "$(complete_line "$work/trainctl" status job-)" "job-7f3a job-9b21 "
check "trainctl cancel job-9<TAB>" "$(complete_line "$work/trainctl" cancel job-9)" "job-9b21 "
touch "$work/a.yaml" "$work/b.txt"
check "trainctl submit <dir>/<TAB> offers specs" "$(complete_line trainctl submit "$work/")" "$work/a.yaml "

# ---- zsh ----
if ! command -v zsh > /dev/null; then
  echo "FAIL: zsh is not installed (./run.sh installs it)"; exit 1
fi
zsh -n "$DIR/_trainctl" || { echo "FAIL: _trainctl does not parse"; fail=1; }
zsh_cmds=$(sed -n "/commands=(/,/^  )/p" "$DIR/_trainctl" | grep -o "^    '[a-z]*" | tr -d "' " | sorted)
check "zsh command list = trainctl --help" "$zsh_cmds" "$help_cmds"
exit $fail
