/**
 * Redis key names and index members. User text (table names are validated, row keys and
 * counter names are arbitrary Unicode) never reaches a Lua source or a SCAN pattern: row
 * keys and counter names are written as base64url of their UTF-8 bytes, so no '{', '}',
 * '*', '?', '[' or ':' from user text ever appears in a key name.
 *
 * Every key starts with `<namespace>:` (the namespace matches /^[a-z][a-z0-9_]{0,31}$/), so
 * `dropNamespace` can SCAN with the pattern `<namespace>:*` and hit nothing else.
 *
 * Hash tags (the part between the first '{' and the next '}' decides the Cluster slot):
 * - row      `<ns>:r:{<table>:<b64 key>}`  each row hashes on its own table+key, so rows
 *                                          spread over every slot and node.
 * - scan idx `<ns>:i:{<ns>:<table>}`       one sorted set per table; the namespace is in
 * - notify   `<ns>:n:{<ns>:<table>}`       the tag so equal table names of different
 *                                          namespaces land on different slots.
 * - counter  `<ns>:c:{<ns>:<b64 name>}`
 * Table names match [A-Za-z0-9_.-] and base64url uses [A-Za-z0-9_-], so no tag contains a
 * brace and each tag is non-empty.
 */

export function rowKeyName(namespace: string, table: string, key: string): string {
  return `${namespace}:r:{${table}:${base64url(key)}}`;
}

export function scanIndexName(namespace: string, table: string): string {
  return `${namespace}:i:{${namespace}:${table}}`;
}

export function notifyIndexName(namespace: string, table: string): string {
  return `${namespace}:n:{${namespace}:${table}}`;
}

export function counterKeyName(namespace: string, name: string): string {
  return `${namespace}:c:{${namespace}:${base64url(name)}}`;
}

/**
 * SCAN pattern for every key of a namespace's layout: rows (r), indexes (i, n) and
 * counters (c), each `<ns>:<kind>:{...}`. Only those: an application's own `<ns>:...` keys
 * on the same server are not ours to drop (`dropRedisNamespace` matches the same). The
 * namespace is validated (`[a-z][a-z0-9_]*`), so it holds no glob characters.
 */
export function namespacePattern(namespace: string): string {
  return `${namespace}:[rinc]:{*`;
}

function base64url(text: string): string {
  return Buffer.from(text, 'utf8').toString('base64url');
}

/*
 * Index members. The scan and notification indexes are sorted sets whose members all have
 * score 0, so ZRANGEBYLEX orders them by raw bytes (memcmp). A member is
 *
 *     escape(utf8(key)) 0x00 0x01 token
 *
 * where escape turns every 0x00 byte into 0x00 0xFF. This encoding keeps UTF-8 byte order
 * (= compareKeys order) and is prefix-free, so whatever token follows, all members of a
 * smaller key sort before all members of a larger one. The token ties an index entry to the
 * one row write that made it (see store.ts for why removals need it).
 */

const TERMINATOR = Buffer.from([0x00, 0x01]);
const AFTER_ALL_TOKENS = Buffer.from([0xff]);

export function escapeKey(key: string): Buffer {
  const raw = Buffer.from(key, 'utf8');
  let zeros = 0;
  for (const byte of raw) if (byte === 0) zeros++;
  if (zeros === 0) return raw;
  const out = Buffer.alloc(raw.length + zeros);
  let j = 0;
  for (const byte of raw) {
    out[j++] = byte;
    if (byte === 0) out[j++] = 0xff;
  }
  return out;
}

export function indexMember(key: string, token: string): Buffer {
  return Buffer.concat([escapeKey(key), TERMINATOR, Buffer.from(token, 'latin1')]);
}

/** The row key of an index member. */
export function memberKey(member: Buffer): string {
  const bytes: number[] = [];
  for (let i = 0; i < member.length; i++) {
    const byte = member[i]!;
    if (byte !== 0) {
      bytes.push(byte);
      continue;
    }
    const next = member[i + 1];
    if (next === 0xff) {
      bytes.push(0);
      i++;
      continue;
    }
    // 0x00 0x01: the key ends here.
    return Buffer.from(bytes).toString('utf8');
  }
  throw new Error('malformed index member (no terminator)');
}

/** ZRANGEBYLEX bound: members of keys >= key. */
export function lexFromKeyInclusive(key: string): Buffer {
  return Buffer.concat([Buffer.from('['), escapeKey(key)]);
}

/** ZRANGEBYLEX bound: members of keys > key (tokens are ASCII, so they sort below 0xFF). */
export function lexAfterKey(key: string): Buffer {
  return Buffer.concat([Buffer.from('('), escapeKey(key), TERMINATOR, AFTER_ALL_TOKENS]);
}

/** ZRANGEBYLEX upper bound: members of keys < key. */
export function lexBeforeKey(key: string): Buffer {
  return Buffer.concat([Buffer.from('('), escapeKey(key)]);
}
