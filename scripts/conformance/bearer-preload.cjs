'use strict';
// Preloaded (node --require) into the MCP conformance suite so that its client
// presents a bearer token to scopegate. The suite itself has no option for one.
//
// Environment:
//   SCOPEGATE_CONFORMANCE_TOKEN   the bearer token (required; without it this file does nothing)
//   SCOPEGATE_CONFORMANCE_ORIGIN  e.g. http://127.0.0.1:8080; only requests to this origin
//                                 get the header, so the token never leaves for another host
//
// The suite's server scenarios reach the server in three ways, all covered here:
//   - the global fetch (the MCP SDK's Streamable HTTP client transport, and the raw
//     requests of the SSE scenarios);
//   - `request` from the npm package undici (the dns-rebinding scenario, which needs to
//     send its own Host header);
//   - node:http's `request` (the header scenarios, which send exact header names and values).
// A header the caller already set is left alone.

const path = require('node:path');

const token = process.env.SCOPEGATE_CONFORMANCE_TOKEN || '';
const origin = process.env.SCOPEGATE_CONFORMANCE_ORIGIN || '';
const debug = process.env.SCOPEGATE_CONFORMANCE_DEBUG === '1';

function log(msg) {
  if (debug) process.stderr.write(`[bearer-preload] ${msg}\n`);
}

function targetsGateway(url) {
  if (!origin) return true;
  try {
    return new URL(String(url)).origin === new URL(origin).origin;
  } catch {
    return false;
  }
}

if (token) {
  const value = `Bearer ${token}`;

  // 1. The global fetch.
  const originalFetch = globalThis.fetch;
  if (typeof originalFetch === 'function') {
    globalThis.fetch = function fetchWithBearer(input, init) {
      const url = input instanceof Request ? input.url : input instanceof URL ? input.href : String(input);
      if (!targetsGateway(url)) return originalFetch.call(this, input, init);
      const headers = new Headers(
        init && init.headers !== undefined ? init.headers : input instanceof Request ? input.headers : undefined,
      );
      if (!headers.has('authorization')) headers.set('authorization', value);
      log(`fetch ${(init && init.method) || (input instanceof Request ? input.method : 'GET')} ${url}`);
      return originalFetch.call(this, input, { ...(init || {}), headers });
    };
  }

  // 2. undici's request(), as the suite imports it. The suite is an ES module that imports
  // the CommonJS undici package; Node hands it the module.exports already in require's
  // cache, so the wrapper installed here is the one the suite calls. Resolve undici from
  // the suite's own location so that it is the very same copy.
  let undici;
  try {
    const from = process.argv[1] ? path.dirname(process.argv[1]) : process.cwd();
    undici = require(require.resolve('undici', { paths: [from] }));
  } catch (err) {
    log(`undici not found next to ${process.argv[1]}: ${err.message}`);
  }
  if (undici && typeof undici.request === 'function') {
    const originalRequest = undici.request;
    const withBearer = (headers) => {
      if (headers == null) return { authorization: value };
      if (Array.isArray(headers)) {
        // Flat [name, value, name, value, ...] list.
        for (let i = 0; i < headers.length; i += 2) {
          if (String(headers[i]).toLowerCase() === 'authorization') return headers;
        }
        return [...headers, 'authorization', value];
      }
      if (typeof headers === 'object' && typeof headers[Symbol.iterator] !== 'function') {
        if (Object.keys(headers).some((k) => k.toLowerCase() === 'authorization')) return headers;
        return { ...headers, authorization: value };
      }
      // Headers instance or another iterable of pairs.
      const copy = new Headers(headers);
      if (!copy.has('authorization')) copy.set('authorization', value);
      return Object.fromEntries(copy.entries());
    };
    undici.request = function requestWithBearer(url, opts, ...rest) {
      const target = typeof url === 'object' && url !== null && !(url instanceof URL) ? url.origin || '' : url;
      if (targetsGateway(target) && (opts == null || typeof opts === 'object')) {
        log(`undici.request ${(opts && opts.method) || 'GET'} ${String(target)}`);
        opts = { ...(opts || {}), headers: withBearer(opts && opts.headers) };
      }
      return originalRequest.call(this, url, opts, ...rest);
    };
  }

  // 3. node:http's request(), which the header scenarios use to send exact header names and
  // values (fetch would normalise them).
  const http = require('node:http');
  const originalHttpRequest = http.request;
  const originOf = (options) => {
    if (!options || typeof options !== 'object') return '';
    const host = options.hostname || (options.host || '').replace(/:\d+$/, '');
    const port = options.port || (options.protocol === 'https:' ? 443 : 80);
    return `${options.protocol || 'http:'}//${host}:${port}`;
  };
  http.request = function requestWithBearer(...args) {
    // request(options[, cb]) or request(url[, options][, cb])
    let [first, second] = args;
    const url = typeof first === 'string' || first instanceof URL ? new URL(String(first)) : null;
    const options = url ? (second && typeof second === 'object' ? second : null) : first;
    const target = url ? url.origin : originOf(options);
    if (targetsGateway(target)) {
      const headers = { ...((options && options.headers) || {}) };
      if (!Object.keys(headers).some((k) => k.toLowerCase() === 'authorization')) headers.authorization = value;
      log(`http.request ${(options && options.method) || 'GET'} ${target}`);
      if (url) {
        if (second && typeof second === 'object') args[1] = { ...second, headers };
        else args.splice(1, 0, { headers });
      } else {
        args[0] = { ...options, headers };
      }
    }
    return originalHttpRequest.apply(this, args);
  };
} else {
  log('SCOPEGATE_CONFORMANCE_TOKEN is not set: requests go out without a bearer token');
}
