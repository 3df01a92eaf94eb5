import { createHash } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';

/**
 * Lua scripts. A plain CAS touches exactly one key, passed in KEYS[1], so it runs unchanged
 * on Redis Cluster. A stamped CAS also touches the oracle's counter key (KEYS[2]), and a
 * stamped read touches the counter and every row it reads; those keys are in different hash
 * slots, so only a standalone Redis runs these two. User text only ever arrives in
 * KEYS and ARGV, never in the source.
 *
 * A row is a hash:  v = version token, s = state bytes,
 *                   x = token of the row's scan-index entry (set when the row is created),
 *                   n = token of its notification-index entry (present iff notified).
 */

/**
 * Check-and-set, plain or stamped (one script, so both share every line of the CAS logic).
 * KEYS[1]                         the row
 * KEYS[2]                         the counter to stamp from (stamped CAS only; absent = plain)
 * ARGV[1] 'absent' | 'version'   what the row must be
 * ARGV[2] expected version        (when ARGV[1] = 'version')
 * ARGV[3] 'put' | 'del'
 * ARGV[4] new version token       (unique; see versions.ts)
 * ARGV[5] new state               (when put)
 * ARGV[6] '1' | '0'               notified after this write (when put)
 * ARGV[7] stamp offset            (stamped only: STAMP_OFFSET, passed so no number is spliced in)
 *
 * Replies:
 *   {1, version, oldX, oldN}   applied. oldX = scan-index token of a deleted row, oldN = the
 *                              notification-index token the row carried before ('' if none);
 *                              the client removes those entries after the reply.
 *   {1, version, oldX, oldN, stamp}
 *                              a stamped put applied; stamp = the 8 big-endian bytes written.
 *   {0}                        not applied, row absent
 *   {0, version, state}        not applied, row's current version and state
 *   {2}                        stamped only: the counter passed 2^53 - 1 (a timestamp the
 *                              client could not hold exactly); the row was not written
 * A put whose new token is already the row's version was applied by an earlier send of this
 * very request (tokens never repeat), so it reports success again without writing (a stamped
 * one reports the stamp that send wrote, read back from the row, and draws nothing).
 *
 * Stamped: the counter (the very key INCRBY serves for incrementCounter) is incremented only
 * once the version check has passed, so a CAS that does not apply leaves the counter alone.
 * Redis runs a script atomically, so whoever draws a later value from the counter, by
 * INCRBY or by another stamped CAS, runs after this script and sees its write. INCR
 * returns an integer that Lua holds as a double, exact up to 2^53; the 8 bytes are built
 * from it with % 256 and exact division (both exact on integers below 2^53), and values
 * from 2^53 on are refused before anything is written.
 */
export const CAS_LUA = `
local row = KEYS[1]
local counter = KEYS[2]
local cur = redis.call('HMGET', row, 'v', 'x', 'n')
local v = cur[1]
if ARGV[3] == 'put' and v == ARGV[4] then
  if counter then
    local at = tonumber(ARGV[7])
    return {1, v, '', '', string.sub(redis.call('HGET', row, 's'), at + 1, at + 8)}
  end
  return {1, v, '', ''}
end
local matches
if ARGV[1] == 'absent' then matches = (v == false) else matches = (v == ARGV[2]) end
if not matches then
  if v == false then return {0} end
  return {0, v, redis.call('HGET', row, 's')}
end
local oldN = cur[3] or ''
if ARGV[3] == 'del' then
  redis.call('DEL', row)
  return {1, ARGV[4], cur[2] or '', oldN}
end
local state = ARGV[5]
local stamp
if counter then
  local ts = redis.call('INCR', counter)
  if ts > 9007199254740991 then return {2} end
  local b = {}
  for i = 8, 1, -1 do
    b[i] = ts % 256
    ts = (ts - b[i]) / 256
  end
  stamp = string.char(b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8])
  local at = tonumber(ARGV[7])
  state = string.sub(state, 1, at) .. stamp .. string.sub(state, at + 9)
end
local x = cur[2]
if v == false then x = ARGV[4] end
if ARGV[6] == '1' then
  redis.call('HSET', row, 'v', ARGV[4], 's', state, 'x', x, 'n', ARGV[4])
else
  redis.call('HSET', row, 'v', ARGV[4], 's', state, 'x', x)
  if oldN ~= '' then redis.call('HDEL', row, 'n') end
end
if stamp then return {1, ARGV[4], '', oldN, stamp} end
return {1, ARGV[4], '', oldN}
`;

/**
 * Stamped read (standalone only): a start timestamp and a batch of reads in one step.
 * KEYS[1]      the counter (the very key INCRBY serves for incrementCounter)
 * KEYS[2..n]   the rows to read, in request order (may repeat)
 * No ARGV.
 *
 * Replies:
 *   {ts, v1, s1, v2, s2, ...}   ts = the value INCR drew; then per row its version and
 *                               state (both nil when the row is absent), in KEYS order
 *   {nil}                       the counter passed 2^53 - 1 (a timestamp the client could
 *                               not hold exactly); nothing was read
 *
 * The INCR comes first and the reads follow in the same script. Redis runs a script
 * atomically, so the reads see every write that ran before the INCR (in particular every
 * stamped CAS that drew a smaller value from this counter), and nothing runs between the
 * INCR and the reads. A Lua `false` (an absent field) stays in the table and becomes a nil
 * reply, so the reply has exactly 1 + 2 * (number of rows) entries.
 */
export const READ_STAMPED_LUA = `
local ts = redis.call('INCR', KEYS[1])
if ts > 9007199254740991 then return {false} end
local out = {ts}
for i = 2, #KEYS do
  local row = redis.call('HMGET', KEYS[i], 'v', 's')
  out[2 * i - 2] = row[1]
  out[2 * i - 1] = row[2]
end
return out
`;

/**
 * The peeked read (capability peekedRead): the counter's value (0 if absent) and the rows,
 * in one script, so one moment; it writes nothing. Every stamped CAS is one script too, so
 * a value V means every write stamped at or below V ran before this one.
 */
export const READ_PEEKED_LUA = `
local ts = tonumber(redis.call('GET', KEYS[1]) or '0')
local out = {ts}
for i = 2, #KEYS do
  local row = redis.call('HMGET', KEYS[i], 'v', 's')
  out[2 * i - 2] = row[1]
  out[2 * i - 1] = row[2]
end
return out
`;

export interface LuaScript {
  readonly source: string;
  readonly sha: string;
}

export function script(source: string): LuaScript {
  return { source, sha: createHash('sha1').update(source).digest('hex') };
}

export const CAS_SCRIPT = script(CAS_LUA);
export const READ_STAMPED_SCRIPT = script(READ_STAMPED_LUA);
export const READ_PEEKED_SCRIPT = script(READ_PEEKED_LUA);

type Client = Redis | Cluster;
type Arg = string | Buffer | number;

/**
 * Runs a script by hash (EVALSHA). A server that lost its script cache (restart, failover,
 * SCRIPT FLUSH) answers NOSCRIPT without running anything; then the script is sent once in
 * full with EVAL, which also caches it again. Routing on Cluster follows KEYS[1].
 */
export async function runScript(
  client: Client,
  lua: LuaScript,
  keys: readonly string[],
  args: readonly Arg[],
) {
  // evalshaBuffer/evalBuffer exist at runtime (ioredis makes a Buffer variant of every
  // command) but are missing from its typings. Not callBuffer: with auto-pipelining,
  // ioredis 5 drops the command name of call/callBuffer.
  const scripting = client as unknown as ScriptingClient;
  try {
    return await scripting.evalshaBuffer(lua.sha, keys.length, ...keys, ...args);
  } catch (error) {
    if (!isNoScript(error)) throw error;
    return await scripting.evalBuffer(lua.source, keys.length, ...keys, ...args);
  }
}

interface ScriptingClient {
  evalshaBuffer(sha: string, numberOfKeys: number, ...keysAndArgs: Arg[]): Promise<unknown>;
  evalBuffer(source: string, numberOfKeys: number, ...keysAndArgs: Arg[]): Promise<unknown>;
}

function isNoScript(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith('NOSCRIPT');
}

/** SCRIPT LOAD on every master, so the first EVALSHA already hits. */
export async function loadScripts(client: Client, scripts: readonly LuaScript[]): Promise<void> {
  const nodes = client.isCluster ? (client as Cluster).nodes('master') : [client as Redis];
  await Promise.all(nodes.flatMap((node) => scripts.map((s) => node.script('LOAD', s.source))));
}
