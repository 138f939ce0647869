#!/usr/bin/env bash
# Model-check the read handle's atomics with loom (src/handle/loom_tests.rs).
#
# The cfg `raft_lease_loom` is given to this crate alone (`cargo rustc`), so the dependencies
# of an earlier `cargo test` build are reused rather than all built again, as a RUSTFLAGS cfg
# would force. Extra arguments go to the test binary (a filter, `--nocapture`).
set -euo pipefail
cd "$(dirname "$0")/.."
exe=$(cargo rustc --quiet --lib --profile test --message-format=json-render-diagnostics \
    -- --cfg raft_lease_loom \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
if [ -z "$exe" ]; then
    echo "loom.sh: cargo named no test binary" >&2
    exit 1
fi
status=0
out=$("$exe" handle::loom_tests "$@") || status=$?
echo "$out"
if [ "$status" -ne 0 ]; then
    exit "$status"
fi
# A filter that matches nothing passes: say so instead.
if grep -q "running 0 tests" <<<"$out"; then
    echo "loom.sh: no loom test ran (was the cfg given?)" >&2
    exit 1
fi
