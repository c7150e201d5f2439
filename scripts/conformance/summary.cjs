'use strict';
// The compact summary of one run of the conformance suite (scripts/conformance.sh), and its
// baseline check over EVERY scenario run, scored or not.
//
// Usage: node summary.cjs MODE RUN_DIR SUITE_LOG SCORED EXPECTED_FAILURES [REQUIRED_CHECKS WHICH]
//   MODE               gateway: fail on a failing scenario (or check) not listed in
//                      EXPECTED_FAILURES and on a listed one that passes (the suite's own rule,
//                      which with --requirements covers only the scored scenarios);
//                      direct: fail on a listed entry that passes directly (an entry may list
//                      only what also fails against the reference server itself)
//   RUN_DIR            the suite's -o folder (server-<scenario>-<timestamp>/checks.json)
//   SUITE_LOG          the suite's output (names the scenarios it started)
//   SCORED             comma-separated scenarios the requirement set scores ('' : all)
//   EXPECTED_FAILURES  the YAML baseline ({server: [scenario | scenario:check-id, ...]})
//   REQUIRED_CHECKS    optional YAML ({server: [scenario:check-id, ...]}): checks that must be
//                      SUCCESS (present, not INFO, not missing) in every scenario of the list
//                      that ran, in either mode
//   WHICH              all: every scenario REQUIRED_CHECKS names must have run (a whole
//                      requirement set); ran: only those that ran are held (named scenarios)
//
// A scenario fails when one of its checks is a FAILURE or a WARNING (as the suite counts it
// for a baseline), or when it started and left no checks.json (it crashed or timed out).
// Exit status: 0 when the baseline holds, 1 when not, 2 on a usage error.

const fs = require('node:fs');
const path = require('node:path');

const [mode, runDir, suiteLog, scoredArg, expectedFile, requiredFile, which] = process.argv.slice(2);
const usage = !['gateway', 'direct'].includes(mode) || !runDir || !suiteLog || expectedFile === undefined;
if (usage || (requiredFile && !['all', 'ran'].includes(which))) {
  console.error('usage: summary.cjs gateway|direct RUN_DIR SUITE_LOG SCORED EXPECTED_FAILURES [REQUIRED_CHECKS all|ran]');
  process.exit(2);
}
const scored = scoredArg ? new Set(scoredArg.split(',')) : null;

// --- the scenarios run, and their checks ---------------------------------------------------
const results = new Map(); // scenario -> checks | null (no checks.json)
let log = '';
try {
  log = fs.readFileSync(suiteLog, 'utf8').replace(/\x1b\[[0-9;]*m/g, '');
} catch {}
for (const m of log.matchAll(/^(?:=== Running scenario: (\S+) ===|Running client scenario '([^']+)')/gm)) {
  const name = m[1] || m[2];
  if (!results.has(name)) results.set(name, null);
}
let dirs = [];
try {
  dirs = fs.readdirSync(runDir).sort();
} catch {}
for (const d of dirs) {
  const m = /^server-(.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$/.exec(d);
  if (!m) continue;
  const file = path.join(runDir, d, 'checks.json');
  if (!fs.existsSync(file)) continue;
  results.set(m[1], JSON.parse(fs.readFileSync(file, 'utf8')));
}

// --- the baseline ----------------------------------------------------------------------------
const listed = (file) => {
  if (!file) return [];
  const YAML = require('yaml');
  const doc = YAML.parse(fs.readFileSync(file, 'utf8')) || {};
  return (doc.server || []).map(String);
};
const entries = listed(expectedFile);
const wholeScenarios = new Set(entries.filter((e) => !e.includes(':')));
const perCheck = new Map();
for (const e of entries.filter((e) => e.includes(':'))) {
  const [s, c] = [e.slice(0, e.indexOf(':')), e.slice(e.indexOf(':') + 1)];
  if (!perCheck.has(s)) perCheck.set(s, new Set());
  perCheck.get(s).add(c);
}

const bad = (c) => c.status === 'FAILURE' || c.status === 'WARNING';
const unexpected = []; // fail and not listed
const stale = []; // listed and pass
const expected = []; // listed and fail
const lines = [];
const totals = { scored: [0, 0, 0, 0], other: [0, 0, 0, 0] }; // scenarios ok, scenarios failing, checks passed, checks failed

for (const [scenario, checks] of results) {
  const isScored = !scored || scored.has(scenario);
  const t = isScored ? totals.scored : totals.other;
  const passed = checks ? checks.filter((c) => c.status === 'SUCCESS').length : 0;
  const failed = checks ? checks.filter((c) => c.status === 'FAILURE').length : 1;
  const warnings = checks ? checks.filter((c) => c.status === 'WARNING').length : 0;
  const failing = !checks || checks.some(bad);
  t[failing ? 1 : 0]++;
  t[2] += passed;
  t[3] += failed;

  let mark = '';
  if (wholeScenarios.has(scenario)) {
    mark = failing ? ' [expected failure]' : ' [listed, passes]';
    (failing ? expected : stale).push(scenario);
  } else if (perCheck.has(scenario)) {
    const listed = perCheck.get(scenario);
    const failingIds = checks ? checks.filter(bad).map((c) => c.id) : [scenario];
    for (const id of failingIds) (listed.has(id) ? expected : unexpected).push(`${scenario}:${id}`);
    for (const id of listed) {
      const c = checks && checks.find((c) => c.id === id && c.status !== 'INFO');
      if (c && c.status === 'SUCCESS') stale.push(`${scenario}:${id}`);
    }
    mark = ' [checks listed]';
  } else if (failing) {
    unexpected.push(scenario);
  }
  const counts = checks
    ? `${passed} passed, ${failed} failed${warnings ? `, ${warnings} warnings` : ''}`
    : 'no checks.json (crashed or timed out)';
  lines.push(`  ${failing ? '✗' : '✓'} ${scenario}: ${counts}${isScored ? '' : ' (not scored)'}${mark}`);
}

const out = [...lines];
const [so, sf, sp, sx] = totals.scored;
out.push(`  scored: ${so + sf} scenarios (${sf} failing), ${sp} checks passed, ${sx} failed`);
if (scored) {
  const [oo, of, op, ox] = totals.other;
  out.push(`  not scored: ${oo + of} scenarios (${of} failing), ${op} checks passed, ${ox} failed`);
}
if (results.size === 0) out.push('  no scenario ran (see the suite log)');

// --- the required checks: SUCCESS, not merely "not failing" ------------------------------------
const unmet = [];
let held = 0;
for (const entry of listed(requiredFile)) {
  const [scenario, id] = [entry.slice(0, entry.indexOf(':')), entry.slice(entry.indexOf(':') + 1)];
  if (!entry.includes(':') || !id) {
    unmet.push(`${entry} (not scenario:check-id)`);
    continue;
  }
  if (!results.has(scenario)) {
    if (which === 'all') unmet.push(`${entry} (the scenario did not run)`);
    continue;
  }
  const checks = results.get(scenario) || [];
  const found = checks.filter((c) => c.id === id);
  if (found.length === 0) unmet.push(`${entry} (missing)`);
  else if (found.some((c) => c.status !== 'SUCCESS')) unmet.push(`${entry} (${found.map((c) => c.status).join(', ')})`);
  else held++;
}
if (held) out.push(`  required checks SUCCESS: ${held}`);
if (unmet.length) out.push(`  REQUIRED CHECKS NOT MET (${path.basename(requiredFile)}): ${unmet.join(', ')}`);

let ok;
if (mode === 'gateway') {
  if (expected.length) out.push(`  expected failures: ${expected.join(', ')}`);
  if (unexpected.length) out.push(`  UNEXPECTED failures (not in ${path.basename(expectedFile)}): ${unexpected.join(', ')}`);
  if (stale.length) out.push(`  STALE entries (listed, now passing; remove them): ${stale.join(', ')}`);
  ok = results.size > 0 && unexpected.length === 0 && stale.length === 0 && unmet.length === 0;
} else {
  const failingDirect = [...expected];
  if (failingDirect.length) out.push(`  listed and failing directly (justified): ${failingDirect.join(', ')}`);
  if (stale.length) out.push(`  LISTED BUT PASSING DIRECTLY (not allowed in ${path.basename(expectedFile)}): ${stale.join(', ')}`);
  ok = results.size > 0 && stale.length === 0 && unmet.length === 0;
}
console.log(out.join('\n'));
process.exit(ok ? 0 : 1);
