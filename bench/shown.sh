# Sourced by bench/h200_env.sh (and by its test, without the device's set-up).

# shown PATTERN LOG COMMAND...: COMMAND's whole output goes to LOG (under $OUT, so it comes back
# with the call's files); prints LOG from the first line matching PATTERN (a sed address), or,
# when COMMAND fails, the log's last 40 lines and its status. A filter on a pipe instead would
# print nothing at all for a run that failed before its table.
shown() {
    pattern=$1 log=$2
    shift 2
    mkdir -p "$(dirname "$log")"
    if "$@" > "$log" 2>&1; then
        sed -n "/$pattern/,\$p" "$log"
    else
        status=$?
        tail -40 "$log"
        echo "FAILED (exit $status), whole log in $log: $*"
        return "$status"
    fi
}
