# Sourced by the one-call device scripts (scripts/pdl_check.sh):
# ``step NAME LIMIT CMD...`` runs CMD under a LIMIT-second timeout with its output in "$out/NAME.log"
# ($out set by the caller) and prints one line: the exit status, the seconds taken and the log's last
# summary line (pytest's, compute-sanitizer's, entry_ab's second pass or its bit-identity refusal).
# Returns CMD's exit status.
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1; local rc=$?
  printf '%-10s rc=%d %4ds  %s\n' "$name" "$rc" $((SECONDS - t0)) \
    "$(grep -E "passed|failed|ERROR SUMMARY|pass 2|does not write" "$out/$name.log" | tail -n 1 | cut -c1-140)"
  return $rc; }
