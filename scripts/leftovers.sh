# What a run of the test suite makes, marked as the run's own, and the check
# at its end, which looks only at what carries the run's marks: other work on
# the machine (another run of the suite among it) is never reported, removed
# or killed. Sourced by scripts/test, and by scripts/leftovers-test, which
# checks it.
#
#   run_begin       makes the run's directory and exports its marks:
#     TMPDIR              $run_dir/tmp: the temporary files of everything
#                         the run starts
#     FERRY_TEST_RUN      $run_id, in the environment of every process the
#                         run starts (and so of their children)
#     FERRY_SHM_PREFIX    ferry-$run_id: shared-memory objects' names (tests
#                         that choose a prefix nest theirs under it)
#     FERRY_NETNS_PREFIX  ferry-$run_id: network namespaces' names
#   run_leftovers   reports what of the run's own is still there (processes
#                   still running $run_grace seconds on, shared-memory
#                   objects, network namespaces, files in its TMPDIR) and
#                   removes it; fails if there was any
#   run_end         removes the run's directory

run_begin() {
    run_dir=$(mktemp -d "${TMPDIR:-/tmp}/ferry-test.XXXXXX")
    # mktemp's letters and digits: valid in every name below.
    run_id=${run_dir##*.}
    mkdir "$run_dir/tmp"
    export TMPDIR="$run_dir/tmp"
    export FERRY_TEST_RUN="$run_id"
    export FERRY_SHM_PREFIX="ferry-$run_id"
    export FERRY_NETNS_PREFIX="ferry-$run_id"
}

# Processes whose environment carries this run's mark, as "<pid> <command>".
# Bash builtins only: a command started here would carry the mark itself.
run_procs() {
    local p e env args cmd
    for p in /proc/[0-9]*; do
        env=()
        mapfile -d '' -t env 2>/dev/null <"$p/environ" || continue
        for e in "${env[@]}"; do
            if [ "$e" = "FERRY_TEST_RUN=$run_id" ]; then
                args=()
                mapfile -d '' -t args 2>/dev/null <"$p/cmdline" || true
                cmd="${args[*]}"
                echo "${p#/proc/} ${cmd:0:160}"
                break
            fi
        done
    done
}

# The run's shared-memory objects and network namespaces.
run_shm() { find /dev/shm -maxdepth 1 -name "ferry-$run_id-*" -printf '%f\n' 2>/dev/null | sort; }
run_netns() {
    { ip netns list 2>/dev/null || true; } | awk -v p="ferry-$run_id-" 'index($1, p) == 1 { print $1 }' | sort
}

# How long the check waits for the run's processes to end on their own. A
# process may still be ending when the suite's last step returns:
# multiprocessing's resource tracker, for one, exits only after its parent
# (pytest) has, once it reads the end of their pipe. That is not a process
# left behind; one still there after this long is.
run_grace=${run_grace:-10}

run_leftovers() {
    local found=0 what tries=0
    what=$(run_procs)
    while [ -n "$what" ] && [ "$tries" -lt $((run_grace * 10)) ]; do
        sleep 0.1
        tries=$((tries + 1))
        what=$(run_procs)
    done
    if [ -n "$what" ]; then
        found=1
        echo "left running:"
        echo "$what"
        # Killed first: they may hold the objects below.
        echo "$what" | awk '{ print $1 }' | xargs -r kill -9 2>/dev/null || true
    fi
    what=$(run_shm)
    if [ -n "$what" ]; then
        found=1
        echo "left in /dev/shm:" $what
        for f in $what; do rm -f "/dev/shm/$f"; done
    fi
    what=$(run_netns)
    if [ -n "$what" ]; then
        found=1
        echo "left as network namespaces:" $what
        for n in $what; do ip netns del "$n" 2>/dev/null || true; done
    fi
    what=$(find "$run_dir/tmp" -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null)
    if [ -n "$what" ]; then
        found=1
        echo "left in the run's temporary directory ($run_dir/tmp):" $what
        find "$run_dir/tmp" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
    fi
    return $found
}

run_end() {
    rm -rf "$run_dir"
}
