# bash completion for trainctl. Install: source this file from ~/.bashrc, or copy it to
# /usr/share/bash-completion/completions/trainctl. Completes subcommands, their flags, job ids
# (from `trainctl list -o json`, when traind answers) and spec files.
# tests/daemon/completion_test.sh checks these lists against `trainctl --help`.

_trainctl_commands="submit list status logs cancel estimate health tokenize generate top"
_trainctl_global_flags="--addr --token --token-file --state-dir -o --output --tls --tls-ca --timeout -h --help"

_trainctl_flags_of() {
  case "$1" in
    submit) echo "--wait --follow --priority --hosts -h --help" ;;
    logs) echo "-f --follow -h --help" ;;
    tokenize) echo "--tokenizer --file --spec --examples -h --help" ;;
    generate) echo "--prompt --chat --max-new-tokens --temperature --top-k --top-p --seed --tokenizer -h --help" ;;
    top) echo "--interval --once -h --help" ;;
    *) echo "-h --help" ;;
  esac
}

# Job ids of the caller, through the same addr/token flags already on the line.
_trainctl_job_ids() {
  local args=() i
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${COMP_WORDS[i]}" in
      --addr|--token|--token-file|--state-dir|--tls-ca|--timeout)
        args+=("${COMP_WORDS[i]}" "${COMP_WORDS[i + 1]}") ;;
      --tls) args+=(--tls) ;;
    esac
  done
  "${COMP_WORDS[0]}" "${args[@]}" --timeout 2 -o json list 2>/dev/null |
    grep -o '"id": *"[^"]*"' | sed 's/.*"\([^"]*\)"$/\1/'
}

_trainctl() {
  local cur prev cmd="" i
  cur="${COMP_WORDS[COMP_CWORD]}"
  prev="${COMP_WORDS[COMP_CWORD - 1]}"
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${COMP_WORDS[i]}" in
      --addr|--token|--token-file|--state-dir|-o|--output|--tls-ca|--timeout) ((i++)) ;;
      -*) ;;
      *) cmd="${COMP_WORDS[i]}"; break ;;
    esac
  done
  case "$prev" in
    -o|--output) COMPREPLY=($(compgen -W "text json" -- "$cur")); return ;;
    --token-file|--tls-ca|--file|--state-dir) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --addr|--token|--timeout|--priority|--interval|--hosts) COMPREPLY=(); return ;;
    --prompt|--chat|--max-new-tokens|--temperature|--top-k|--top-p|--seed|--examples) COMPREPLY=(); return ;;
    --tokenizer) COMPREPLY=($(compgen -W "byte" -- "$cur") $(compgen -f -- "$cur")); return ;;
    --spec) COMPREPLY=($(compgen -f -- "$cur")); return ;;
  esac
  if [[ -z "$cmd" ]]; then
    if [[ "$cur" == -* ]]; then
      COMPREPLY=($(compgen -W "$_trainctl_global_flags" -- "$cur"))
    else
      COMPREPLY=($(compgen -W "$_trainctl_commands" -- "$cur"))
    fi
    return
  fi
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$(_trainctl_flags_of "$cmd")" -- "$cur"))
    return
  fi
  case "$cmd" in
    submit|estimate)  # spec files (.yaml, .yml, .json) and folders
      local f
      while IFS= read -r f; do
        [[ -d "$f" || "$f" == *.yaml || "$f" == *.yml || "$f" == *.json ]] && COMPREPLY+=("$f")
      done < <(compgen -f -- "$cur") ;;
    status|logs|cancel) COMPREPLY=($(compgen -W "$(_trainctl_job_ids)" -- "$cur")) ;;
    generate) COMPREPLY=($(compgen -d -- "$cur")) ;;  # OUTPUT_DIR: a job's output folder
    *) COMPREPLY=() ;;
  esac
}
complete -F _trainctl trainctl
