#!/usr/bin/env bash
# What policies cost a proxied call, measured with the side-by-side harness (the shared perf
# folder, copied somewhere writable): two gateways of this checkout's release build in front of
# one echo-upstream, in one run, the second with a realistic set of 50 policies loaded for the
# bench tenant (acme): argument conditions on the called tool, circumstances on every tool,
# native tools', prompts' and resources' policies, of which 20 are evaluated for the bench's call.
#
#   cargo build --release --locked --bin scopegate
#   scripts/policy-perf.sh HARNESS_DIR [sqlite|postgres]        # MODE, PROTOCOL, REPEATS, DURATION pass to bench.sh
#
# Loopback only; every process it starts is stopped when it ends.
set -euo pipefail
PROJECT=$(cd "$(dirname "$0")/.." && pwd)
HARNESS=$(cd "$1" && pwd); DB=${2:-sqlite}
BIN=$PROJECT/target/release/scopegate
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release --locked --bin scopegate" >&2; exit 2; }
cd "$HARNESS"
[ -x target/release/echo-upstream ] && [ -x target/release/mcp-load ] || cargo build --release
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
taskset -c 1 target/release/echo-upstream --port 9100 > /dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 1 50); do curl -s -o /dev/null http://127.0.0.1:9100/mcp && break; sleep 0.1; done

start() { # port metrics-port -> sets URL, TOKEN_FILE, WORK
  local out
  out=$(SG_PORT=$1 SCOPEGATE_METRICS__LISTEN=127.0.0.1:$2 ./scopegate.sh "$PROJECT" "$DB")
  PIDS+=("$(cat results/scopegate.pid)")
  URL=$(sed -n 's/.*SG_URL=\([^ ]*\).*/\1/p' <<< "$out")
  WORK=$(sed -n 's/^# work dir \([^ ]*\).*/\1/p' <<< "$out")
  TOKEN_FILE=$WORK/token.txt
  cp results/sg-token.txt "$TOKEN_FILE"
}
start 9200 9464; PLAIN_URL=$URL; PLAIN_TOKEN=$TOKEN_FILE
start 9201 9465; POLICY_URL=$URL; POLICY_TOKEN=$TOKEN_FILE; POLICY_WORK=$WORK
case $DB in
  sqlite) POLICY_DB=sqlite://$POLICY_WORK/sg.db ;;
  postgres) POLICY_DB=$(psql -h 127.0.0.1 -U postgres -Atc "SELECT 'postgres://postgres@127.0.0.1:5432/' || datname FROM pg_database WHERE datname LIKE 'sgperf_%' ORDER BY oid DESC LIMIT 1") ;;
esac

# A tools/list records echo's tools for the tenant's policy schema (policies naming a tool
# validate only once the gateway has listed it).
mcp() { # url token session body -> response headers and body on stdout
  local session=()
  [ -n "$3" ] && session=(-H "Mcp-Session-Id: $3")
  curl -s -D - -X POST "$1" -H "Authorization: Bearer $2" -H 'Content-Type: application/json' \
    -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2025-11-25' \
    "${session[@]}" -d "$4"
}
TOKEN=$(tr -d '\n' < "$POLICY_TOKEN")
SESSION=$(mcp "$POLICY_URL" "$TOKEN" "" '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"policy-perf","version":"1"}}}' \
  | tr -d '\r' | sed -n 's/^mcp-session-id: //Ip')
mcp "$POLICY_URL" "$TOKEN" "$SESSION" '{"jsonrpc":"2.0","method":"notifications/initialized"}' > /dev/null
mcp "$POLICY_URL" "$TOKEN" "$SESSION" '{"jsonrpc":"2.0","id":2,"method":"tools/list"}' | grep -q echo__echo

POLICIES=$(mktemp -d)
put() { printf '%s\n' "$2" > "$POLICIES/$1.cedar"
  SCOPEGATE_DATABASE__URL=$POLICY_DB "$BIN" admin policy put --tenant acme "$1" --file "$POLICIES/$1.cedar" > /dev/null; }
for i in 0 1 2 3 4; do
  put "echo-owner-$i" "permit (principal in Role::\"owner\", action == Action::\"echo__echo\", resource) when { !(context.arguments.text like \"*secret-$i*\") };"
  put "echo-forbid-$i" "forbid (principal, action == Action::\"echo__echo\", resource) when { context.arguments.text like \"*drop table $i*\" };"
  put "night-$i" "forbid (principal in Role::\"worker\", action in Action::\"call_tool\", resource) when { context.time.toTime() >= duration(\"$((19 + i))h\") };"
  put "client-$i" "forbid (principal, action in Action::\"call_tool\", resource) when { resource.destructiveHint && context has client && context.client == \"blocked-client-$i\" };"
  put "auditors-$i" "permit (principal in Role::\"auditor\", action in Action::\"call_tool\", resource in Server::\"echo\") when { resource.readOnlyHint };"
  put "subject-$i" "forbid (principal, action in Action::\"call_tool\", resource) when { principal.subject == \"mallory-$i@acme.test\" };"
  put "eggs-$i" "forbid (principal in Role::\"worker\", action == Action::\"record_egg_count\", resource) when { context.arguments.eggs > $((5000 + i)) };"
  put "flock-$i" "forbid (principal, action == Action::\"get_flock\", resource) when { principal.subject == \"blocked-$i@acme.test\" };"
  put "private-$i" "forbid (principal, action == Action::\"read_resource\", resource is Resource in Server::\"echo\") when { resource.uri like \"*private-$i*\" };"
  put "prompt-$i" "permit (principal in Role::\"manager\", action == Action::\"get_prompt\", resource is Prompt in Server::\"echo\") when { resource.name == \"p$i\" };"
done
case $DB in
  sqlite) COUNT="sqlite3 $POLICY_WORK/sg.db" ;;
  postgres) COUNT="psql -At ${POLICY_DB}" ;;
esac
echo "policies on the second gateway: $($COUNT "SELECT COUNT(*) FROM policies")"

SG_URL=$PLAIN_URL SG_TOKEN_FILE=$PLAIN_TOKEN SG_TOOL=echo__echo SG_LABEL=scopegate \
SG2_URL=$POLICY_URL SG2_TOKEN_FILE=$POLICY_TOKEN SG2_TOOL=echo__echo SG2_LABEL=scopegate-50-policies \
  ./bench.sh

# The policies took part in the measured calls: their decisions are in the audit.
echo "calls of the second gateway audited with a policy decision: $($COUNT "SELECT COUNT(*) FROM audit_events WHERE policy IS NOT NULL")"
