import { createHash } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';

/**
 * Lua scripts. A plain CAS touches exactly one key, passed in KEYS[1], so it runs unchanged
 * on Redis Cluster. A stamped CAS also touches the oracle's counter key (KEYS[2]), a
 * stamped CAS of many rows touches the counter, its rows and their tables' indexes, and a
 * stamped read touches the counter and every row it reads; those keys are in different hash
 * slots, so only a standalone Redis runs these. User text only ever arrives in KEYS and
 * ARGV, never in the source.
 *
 * A row is a hash:  v = version token, s = state bytes,
 *                   x = token of the row's scan-index entry (set when the row is created),
 *                   n = token of its notification-index entry (present iff notified).
 */

/**
 * The row logic every CAS script shares (one place for each concept), composed into the
 * head of CAS_LUA and CAS_MANY_LUA as local functions. Nothing user-given is in it: rows,
 * counters, tokens, states and the stamp offset arrive as arguments from KEYS/ARGV.
 *
 * matches(v, mode, expected)   whether a row whose version is v (false = absent) is what a
 *                              request expects: mode 'absent' | 'version'
 * draw_stamp(counter)          INCR the counter; the 8 big-endian bytes of the new value, or
 *                              nil (after the INCR, before any row write) past 2^53 - 1
 * with_stamp(state, at, st)    the state with its bytes at 0-based [at, at + 8) set to st
 * stamp_of(row, at)            the 8 stamp bytes a row's state carries
 * put_row(row, v, x, oldN, token, state, notified)
 *                              writes a put: version token, state, x (set to the token on a
 *                              create: the row's scan-index entry) and n (the token when
 *                              notified; cleared otherwise). v, x, oldN are the row's
 *                              fields before ('' for no n).
 *
 * INCR returns an integer that Lua holds as a double, exact up to 2^53; the 8 bytes are
 * built from it with % 256 and exact division (both exact on integers below 2^53), and
 * values from 2^53 on are refused before anything but the counter is written.
 */
const ROW_LUA = `
local function matches(v, mode, expected)
  if mode == 'absent' then return v == false end
  return v == expected
end
local function draw_stamp(counter)
  local ts = redis.call('INCR', counter)
  if ts > 9007199254740991 then return nil end
  local b = {}
  for i = 8, 1, -1 do
    b[i] = ts % 256
    ts = (ts - b[i]) / 256
  end
  return string.char(b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8])
end
local function with_stamp(state, at, st)
  return string.sub(state, 1, at) .. st .. string.sub(state, at + 9)
end
local function stamp_of(row, at)
  return string.sub(redis.call('HGET', row, 's'), at + 1, at + 8)
end
local function put_row(row, v, x, oldN, token, state, notified)
  if v == false then x = token end
  if notified then
    redis.call('HSET', row, 'v', token, 's', state, 'x', x, 'n', token)
  else
    redis.call('HSET', row, 'v', token, 's', state, 'x', x)
    if oldN ~= '' then redis.call('HDEL', row, 'n') end
  end
end
`;

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
 * INCRBY or by another stamped CAS, runs after this script and sees its write.
 */
export const CAS_LUA = `${ROW_LUA}
local row = KEYS[1]
local counter = KEYS[2]
local cur = redis.call('HMGET', row, 'v', 'x', 'n')
local v = cur[1]
if ARGV[3] == 'put' and v == ARGV[4] then
  if counter then return {1, v, '', '', stamp_of(row, tonumber(ARGV[7]))} end
  return {1, v, '', ''}
end
if not matches(v, ARGV[1], ARGV[2]) then
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
  stamp = draw_stamp(counter)
  if not stamp then return {2} end
  state = with_stamp(state, tonumber(ARGV[7]), stamp)
end
put_row(row, v, cur[2], oldN, ARGV[4], state, ARGV[6] == '1')
if stamp then return {1, ARGV[4], '', oldN, stamp} end
return {1, ARGV[4], '', oldN}
`;

/**
 * Stamped check-and-set of many rows, all or nothing (standalone only: it touches rows of
 * many slots, their tables' indexes and the counter).
 * KEYS[1]          the counter to stamp from (the very key INCRBY serves)
 * per row i (1-based), in request order, at k = 3 * i - 1:
 *   KEYS[k]        the row
 *   KEYS[k + 1]    its table's scan index
 *   KEYS[k + 2]    its table's notification index
 * ARGV[1]          stamp offset (STAMP_OFFSET, passed so no number is spliced in)
 * per row i, at a = 6 * i - 4:
 *   ARGV[a]        'absent' | 'version'   what the row must be
 *   ARGV[a + 1]    expected version        (when 'version')
 *   ARGV[a + 2]    new version token       (unique; see versions.ts)
 *   ARGV[a + 3]    new state (with the 8-byte placeholder at the stamp offset)
 *   ARGV[a + 4]    '1' | '0'               notified after this write
 *   ARGV[a + 5]    the row's index-member prefix: escape(key) 0x00 0x01 (see keys.ts), to
 *                  which a token is appended to name an index entry
 * The rows are distinct (the client checks).
 *
 * Every row's version is checked first, writing nothing. Only if all match is the counter
 * incremented, once, and every row written with that stamp exactly as CAS_LUA writes a
 * stamped put (put_row). Redis runs a script atomically, so whoever draws a later value
 * from the counter (INCRBY, a stamped CAS, a stamped read) runs after this script and sees
 * every one of its writes; nobody sees some without the others.
 *
 * Indexes: the script keeps them itself, in the same step (every key is on the one server):
 * a created row's scan-index entry and a notified row's notification-index entry are added,
 * and the notification entry the row carried before (n) is removed when the write replaces
 * or clears it. The entries are the ones the single CAS makes (member prefix + token, row
 * fields x and n), so any later single CAS finds and cleans them as its own.
 *
 * Replies:
 *   {1, stamp}                     applied; stamp = the 8 big-endian bytes written into every
 *                                  row; the versions are the tokens sent, in request order
 *   {0, v1, s1, v2, s2, ...}       not applied, nothing written and nothing drawn; each row's
 *                                  current version and state (both nil when absent), in
 *                                  request order
 *   {2}                            the counter passed 2^53 - 1; no row was written
 * A lost reply: a row whose version already is its new token can only have been written by
 * an earlier run of this very request (tokens never repeat), and a run writes all of its
 * rows or none, so the request reports success again with the stamp that run wrote, reading
 * it back from that row, writing and drawing nothing (as CAS_LUA does for one row).
 */
export const CAS_MANY_LUA = `${ROW_LUA}
local counter = KEYS[1]
local at = tonumber(ARGV[1])
local n = (#KEYS - 1) / 3
local cur = {}
local all = true
for i = 1, n do
  local row = KEYS[3 * i - 1]
  local a = 6 * i - 4
  local c = redis.call('HMGET', row, 'v', 'x', 'n')
  if c[1] == ARGV[a + 2] then return {1, stamp_of(row, at)} end
  if not matches(c[1], ARGV[a], ARGV[a + 1]) then all = false end
  cur[i] = c
end
if not all then
  local out = {0}
  for i = 1, n do
    local v = cur[i][1]
    out[2 * i] = v
    if v then out[2 * i + 1] = redis.call('HGET', KEYS[3 * i - 1], 's') else out[2 * i + 1] = false end
  end
  return out
end
local stamp = draw_stamp(counter)
if not stamp then return {2} end
for i = 1, n do
  local row = KEYS[3 * i - 1]
  local a = 6 * i - 4
  local v, x, oldN = cur[i][1], cur[i][2], cur[i][3] or ''
  local token, prefix, notified = ARGV[a + 2], ARGV[a + 5], ARGV[a + 4] == '1'
  put_row(row, v, x, oldN, token, with_stamp(ARGV[a + 3], at, stamp), notified)
  if v == false then redis.call('ZADD', KEYS[3 * i], 0, prefix .. token) end
  if notified then redis.call('ZADD', KEYS[3 * i + 1], 0, prefix .. token) end
  if oldN ~= '' then redis.call('ZREM', KEYS[3 * i + 1], prefix .. oldN) end
end
return {1, stamp}
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
export const CAS_MANY_SCRIPT = script(CAS_MANY_LUA);
export const READ_STAMPED_SCRIPT = script(READ_STAMPED_LUA);
export const READ_PEEKED_SCRIPT = script(READ_PEEKED_LUA);

type Client = Redis | Cluster;
type Arg = string | Buffer | number;

/**
 * Runs a script by hash (EVALSHA). A server that lost its script cache (restart, failover,
 * SCRIPT FLUSH) answers NOSCRIPT without running anything; then the script is sent once in
 * full with EVAL, which also caches it again. Routing on Cluster follows KEYS[1].
 */
export function runScript(
  client: Client,
  lua: LuaScript,
  keys: readonly string[],
  args: readonly Arg[],
): Promise<unknown> {
  // evalshaBuffer/evalBuffer exist at runtime (ioredis makes a Buffer variant of every
  // command) but are missing from its typings. Not callBuffer: on a client that
  // auto-pipelines (the store's own do not; a user's standalone client may), ioredis 5
  // drops the command name of call/callBuffer.
  const scripting = client as unknown as ScriptingClient;
  // A handler on the command's own promise, no async frame: every read and commit runs here.
  try {
    return scripting.evalshaBuffer(lua.sha, keys.length, ...keys, ...args).catch((error: unknown) => {
      if (!isNoScript(error)) throw error;
      return scripting.evalBuffer(lua.source, keys.length, ...keys, ...args);
    });
  } catch (error) {
    return Promise.reject(error);
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
