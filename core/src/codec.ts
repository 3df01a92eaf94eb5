import { copyBytes } from './byte-pool.js';
import { CorruptRowError } from './errors.js';
import { shownName } from './names.js';
import {
  Cell,
  type EncodedHistory,
  isAnchored,
  type Lock,
  type RecordKind,
  type RowKey,
  type RowState,
  type ValuePlace,
  type WriteRecord,
} from './row-state.js';

/**
 * Binary encoding of head rows and version rows (docs/protocol.md section 2). Every
 * protocol step decodes and re-encodes a head row, so it is compact and fast. All integers
 * are unsigned LEB128 varints (they hold any safe integer); signed ones are zigzagged.
 *
 * Head row, format 4 (formats 2 and 3 are read too: format 3 is the same without the anchor
 * bits of the records, format 2 also without bit 4 of the cell flags):
 *   format=4, stamp (8 bytes, big endian, at STAMP_OFFSET), n cells, per cell: name,
 *   flags(bit0 lock, bit1 notify, bit2 garbage, bit3 notifyTs is the stamp, bit4 history),
 *   prunedThrough,
 *   n data {startTs, bytes},
 *   [lock {startTs, table, row, column, kind, ttlMs, wallTimeMs, n secondaries {table, row}}],
 *   n writes, newest first, each {bits (kind | place<<2 | hasSecondaries<<4 | stamped<<5
 *     | startStamped<<6 | anchored<<7), unstamped: zigzag(commitTs - base), commitTs - startTs; stamped:
 *     startTs; start-stamped: nothing (base 0 after it);
 *     wallTimeMs (the first absolute, then zigzag of the newer one's minus this),
 *     [n secondaries], [anchored: zigzag(block - startTs)]}, where base is the newer record's
 *     commitTs (its startTs if stamped), 0 for the first;
 *   [notifyTs, unless bit3], n acks {name, ts}, [n garbage {startTs}],
 *   [history: length (a varint padded to 4 bytes), count, newestCommitTs, newestWallTimeMs,
 *     the two smallest wallTimeMs of records with no secondaries (plus 1; 0: none), inlineBytes,
 *     movingBytes, moving, inline (records with their value here), held, then the records
 *     oldest first,
 *     each {bits (kind | place<<2 | hasSecondaries<<4 | hasValue<<5 | anchored<<6), zigzag(commitTs - the
 *     older one's, 0 for the first), commitTs - startTs, zigzag(wallTimeMs - the older
 *     one's), [n secondaries], [value bytes], [anchored: zigzag(block - startTs)]}].
 * A record is anchored when its value is in a version row named by another record's startTs
 * (its group's anchor, `WriteRecord.block`): a block of values moved together.
 * The records and values before the history are the cell's recent ones: the newest put or
 * delete, any rollback newer than it, and one more (HOT_RECORDS). Older ones go to the
 * history, which is oldest first so that records demoted later are appended after its
 * bytes, which a write that does not decode them copies as they are (row-state.ts, Cell).
 * A stamped record's commitTs is the row's stamp: a store with `stampedCheckAndSet` writes
 * it into the 8-byte slot in the same atomic step as the write, so a one-phase commit (or a
 * primary commit) needs no round trip for its commit timestamp. In memory such a record
 * carries commitTs STAMP until then; every later write re-encodes it with its real value.
 * A start-stamped record (a one-phase blind write, section 4) also has startTs = the stamp:
 * in memory its startTs and its data key are STAMP, encoded as the bit and data key 0.
 * Version row (a block), format 18: format=18, n values, each {startTs, value bytes},
 * newest first. Format 19 (written inside a one-step commit, which stamps every row it
 * writes): format=19, the stamp slot (8 bytes at STAMP_OFFSET, unused), then as format 18.
 * Formats 16 and 17 (one value per version row, before blocks) are read too: format=16,
 * then the value's bytes; format=17, the stamp slot, then the value's bytes.
 *
 * A row in any other format (format 1 was the first version's single-blob layout) is a
 * CorruptRowError: never guessed at.
 */
export const HEAD_FORMAT = 4;
/** Head rows written before version blocks (no anchored records): read, never written. */
const HEAD_FORMAT_3 = 3;
/** Head rows written before cell histories: read, never written. */
const HEAD_FORMAT_2 = 2;
/** Records a cell keeps recent past its newest put or delete (and the rollbacks newer than it). */
const HOT_EXTRA = 1;
/** The commitTs of a record whose timestamp the store will stamp (sorts newest). */
export const STAMP = Number.MAX_SAFE_INTEGER;
/**
 * The highest timestamp a client takes (2^52 - 1). A row keeps the difference of two of a
 * cell's timestamps zigzagged (Writer.int): exact only while it is below 2^52 either way,
 * so every timestamp stays below 2^52. That is 142 years of LocalOracle microseconds since
 * 1970, or 4.5e15 counter draws. Every timestamp that enters the client is checked against
 * it (oracle.ts: the oracles, a custom oracle's values, the store's stamped replies); past
 * it, a non-retryable StoreError and nothing written. So STAMP is never a real timestamp.
 */
export const MAX_TIMESTAMP = 2 ** 52 - 1;
/** Writer.int's bound: a zigzagged value from -2^52 up to 2^52 - 1 is a safe integer. */
const MAX_INT_MAGNITUDE = 2 ** 52;
/** A version row of one value (before blocks): read, never written. */
export const VERSION_FORMAT = 16;
/** The same with a stamp slot: read, never written. */
export const VERSION_FORMAT_STAMPED = 17;
/** A version row holding a block of values. */
export const BLOCK_FORMAT = 18;
/** A block with a stamp slot, written by a one-step commit (which stamps every row). */
export const BLOCK_FORMAT_STAMPED = 19;
const KINDS: RecordKind[] = ['put', 'delete', 'rollback'];
const PLACES: ValuePlace[] = ['inline', 'moving', 'moved'];
const KIND_BITS: Record<RecordKind, number> = { put: 0, delete: 1, rollback: 2 };
const PLACE_BITS: Record<ValuePlace, number> = { inline: 0 << 2, moving: 1 << 2, moved: 2 << 2 };
const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
/** Names up to this many bytes, all ASCII, are decoded byte by byte (Reader.string). */
const SHORT_ASCII = 24;

/**
 * One scratch buffer for every encode: encoding is synchronous, so it is never shared, and
 * the result is a copy of just the bytes written (from the byte pool when small:
 * byte-pool.ts). Saves an allocation (and its zeroing) per encode; a buffer that grew
 * past 1 MiB is not kept.
 */
let scratch: Uint8Array = new Uint8Array(64 * 1024);

/**
 * Writes a safe integer as 8 bytes, big endian, at `offset`: the codec's fixed-width fields
 * and the stamp slot of every stamped write (store.ts, writeStampInPlace), byte by byte
 * with no DataView or BigInt.
 */
export function putUint64BE(bytes: Uint8Array, offset: number, value: number): void {
  const high = Math.floor(value / 2 ** 32);
  const low = value >>> 0;
  for (let i = 0; i < 4; i++) bytes[offset + i] = (high >>> (24 - 8 * i)) & 0xff;
  for (let i = 0; i < 4; i++) bytes[offset + 4 + i] = (low >>> (24 - 8 * i)) & 0xff;
}

class Writer {
  buf: Uint8Array;
  pos = 0;
  constructor(size = 256) {
    if (size > scratch.length && size <= 1024 * 1024) scratch = new Uint8Array(size);
    this.buf = size <= scratch.length ? scratch : new Uint8Array(size);
  }
  private ensure(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.pos));
    this.buf = next;
  }
  uint(value: number): void {
    this.ensure(8);
    let v = value;
    // Most numbers are small deltas: one byte, or 32-bit shifts; wall times take the long way.
    if (v < 0x80) {
      this.buf[this.pos++] = v;
      return;
    }
    if (v <= 0xffffffff) {
      while (v >= 0x80) {
        this.buf[this.pos++] = (v & 0x7f) | 0x80;
        v >>>= 7;
      }
      this.buf[this.pos++] = v;
      return;
    }
    while (v >= 0x80) {
      this.buf[this.pos++] = (v % 0x80) | 0x80;
      v = Math.floor(v / 0x80);
    }
    this.buf[this.pos++] = v;
  }
  int(value: number): void {
    // Past 2^52 either way the zigzagged value passes 2^53 and is rounded: the row would be
    // written and then read wrong. Only a timestamp past MAX_TIMESTAMP gets here (one the
    // store stamped into a row before the client refused it), so the write is refused.
    if (!(value >= -MAX_INT_MAGNITUDE && value < MAX_INT_MAGNITUDE)) {
      throw new CorruptRowError(
        `a timestamp past MAX_TIMESTAMP (2^52 - 1) cannot be encoded exactly (a difference of ${value}): not written`,
      );
    }
    this.uint(value >= 0 ? value * 2 : -value * 2 - 1);
  }
  /** Room for a varint written later with `patch4` (at most 2^28 - 1). */
  reserve4(): number {
    this.ensure(4);
    const at = this.pos;
    this.pos += 4;
    return at;
  }
  /** A varint in exactly 4 bytes (padded with continuation bits, which decode as zero). */
  patch4(at: number, value: number): void {
    if (value >= 2 ** 28) throw new RangeError('history section too large');
    for (let i = 0; i < 3; i++) this.buf[at + i] = ((value >>> (7 * i)) & 0x7f) | 0x80;
    this.buf[at + 3] = (value >>> 21) & 0x7f;
  }
  /** 8 bytes, big endian (the stamp slot). */
  fixed64(value: number): void {
    this.ensure(8);
    putUint64BE(this.buf, this.pos, value);
    this.pos += 8;
  }
  raw(value: Uint8Array): void {
    this.ensure(value.length);
    this.buf.set(value, this.pos);
    this.pos += value.length;
  }
  bytes(value: Uint8Array): void {
    this.uint(value.length);
    this.raw(value);
  }
  string(value: string): void {
    // Short ASCII names (the common case) are written char by char: no view, no encodeInto.
    if (value.length <= SHORT_ASCII) {
      this.ensure(value.length + 1);
      const { buf } = this;
      const at = this.pos + 1;
      let i = 0;
      for (; i < value.length; i++) {
        const c = value.charCodeAt(i);
        if (c >= 0x80) break;
        buf[at + i] = c;
      }
      if (i === value.length) {
        buf[this.pos] = i; // the length: one byte, as uint() writes it below 0x80
        this.pos = at + i;
        return;
      }
    }
    // Encode in place after room for the longest length prefix, then slide it down.
    this.ensure(value.length * 3 + 16);
    const start = this.pos + 8;
    const { written } = encoder.encodeInto(value, this.buf.subarray(start));
    this.uint(written);
    this.buf.copyWithin(this.pos, start, start + written);
    this.pos += written;
  }
  result(): Uint8Array {
    const out = copyBytes(this.buf.subarray(0, this.pos));
    if (this.buf !== scratch && this.buf.length <= 1024 * 1024 && this.buf.length > scratch.length)
      scratch = this.buf;
    return out;
  }
}

/** The scale of a varint's eighth byte, its last (2^49). */
const MAX_VARINT_SCALE = 0x80 ** 7;

class Reader {
  pos = 0;
  constructor(private readonly buf: Uint8Array) {}
  uint(): number {
    // One byte (most deltas and counts), else the general loop (exact past 32 bits).
    if (this.pos < this.buf.length && this.buf[this.pos]! < 0x80) return this.buf[this.pos++]!;
    const result = this.varint();
    // Past 2^53 the sum is no longer exact: a timestamp or a length read wrong, not refused.
    if (result > Number.MAX_SAFE_INTEGER) throw new CorruptRowError('row state holds a number past 2^53 - 1');
    return result;
  }
  int(): number {
    // Timestamps stay at or below MAX_TIMESTAMP (2^52 - 1), so the writer's zigzag of a delta
    // is below 2^53: a larger one is damage, refused before it is rounded (a sum past 2^53 is).
    const z =
      this.pos < this.buf.length && this.buf[this.pos]! < 0x80 ? this.buf[this.pos++]! : this.varint();
    if (z > Number.MAX_SAFE_INTEGER) throw new CorruptRowError('row state holds a number past 2^53 - 1');
    return z % 2 === 0 ? z / 2 : -(z + 1) / 2;
  }
  /** The general loop: at most 8 bytes (56 bits, more than any safe integer needs). */
  private varint(): number {
    let result = 0;
    let scale = 1;
    for (;;) {
      if (this.pos >= this.buf.length) throw new CorruptRowError('row state is truncated');
      const b = this.buf[this.pos++]!;
      result += (b & 0x7f) * scale;
      if (b < 0x80) return result;
      // A ninth byte is damage (a run of continuation bytes would otherwise be read to the
      // end of the row, its sum long past exact).
      if (scale === MAX_VARINT_SCALE)
        throw new CorruptRowError('row state holds a varint longer than 8 bytes');
      scale *= 0x80;
    }
  }
  fixed64(): number {
    if (this.pos + 8 > this.buf.length) throw new CorruptRowError('row state is truncated');
    let high = 0;
    let low = 0;
    for (let i = 0; i < 4; i++) high = high * 256 + this.buf[this.pos + i]!;
    for (let i = 0; i < 4; i++) low = low * 256 + this.buf[this.pos + 4 + i]!;
    this.pos += 8;
    const value = high * 2 ** 32 + low;
    if (!Number.isSafeInteger(value)) throw new CorruptRowError('row stamp is past the safe integer range');
    return value;
  }
  /** The next `n` bytes, a view. */
  take(n: number): Uint8Array {
    if (this.pos + n > this.buf.length) throw new CorruptRowError('row state is truncated');
    const out = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }
  /** A view into the row's bytes, not a copy: callers that hand a value out copy it. */
  bytes(): Uint8Array {
    const n = this.uint();
    if (this.pos + n > this.buf.length) throw new CorruptRowError('row state is truncated');
    const out = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }
  string(): string {
    const n = this.uint();
    if (this.pos + n > this.buf.length) throw new CorruptRowError('row state is truncated');
    // Names (columns, tables, row keys) are mostly short ASCII: built from the bytes
    // directly, with no view and no TextDecoder call (which costs more than the rest of
    // reading a short name). Anything else goes through the strict decoder.
    if (n <= SHORT_ASCII) {
      const { buf, pos } = this;
      let out = '';
      let i = 0;
      for (; i < n; i++) {
        const b = buf[pos + i]!;
        if (b >= 0x80) break;
        out += String.fromCharCode(b);
      }
      if (i === n) {
        this.pos += n;
        return out;
      }
    }
    let out: string;
    try {
      out = decoder.decode(this.buf.subarray(this.pos, this.pos + n));
    } catch {
      throw new CorruptRowError('row state holds a name that is not UTF-8');
    }
    this.pos += n;
    return out;
  }
}

function writeRows(w: Writer, rows: readonly RowKey[] | undefined): void {
  w.uint(rows?.length ?? 0);
  for (const r of rows ?? []) {
    w.string(r.table);
    w.string(r.row);
  }
}

function readRows(r: Reader): RowKey[] | undefined {
  const n = r.uint();
  if (n === 0) return undefined;
  const rows: RowKey[] = [];
  for (let i = 0; i < n; i++) rows.push({ table: r.string(), row: r.string() });
  return rows;
}

/**
 * How many of a cell's newest records stay recent: through its newest put or delete, one
 * more (a snapshot just before the last commit is read often), never a record that waits
 * for its stamp, and through the oldest `moving` record.
 */
function recentCount(writes: readonly WriteRecord[]): number {
  let i = 0;
  while (i < writes.length && writes[i]!.kind === 'rollback') i++;
  let n = Math.min(writes.length, i + 1 + HOT_EXTRA);
  while (n < writes.length && (writes[n]!.commitTs === STAMP || writes[n]!.startTs === STAMP)) n++;
  // A `moving` record stays recent until the tidy step has moved it (then the tidy step's
  // CAS finds it without decoding the history), and so do the records before it.
  for (let j = writes.length - 1; j >= n; j--) {
    if (writes[j]!.value === 'moving') return j + 1;
  }
  return n;
}

export function encodeRow(row: RowState): Uint8Array {
  // Room for the values and about 32 bytes per record, lock and name: one allocation, usually.
  let size = 64;
  for (const cell of row.cells.values()) {
    size += 96 + cell.recent.length * 32 + (cell.history?.body.length ?? 0);
    for (const value of cell.recentData.values()) size += value.length + 8;
  }
  const w = new Writer(size);
  w.uint(HEAD_FORMAT);
  w.fixed64(0); // the stamp slot: filled by the store, or unused
  w.uint(row.cells.size);
  for (const [name, cell] of row.cells) encodeCell(w, name, cell);
  return w.result();
}

/** Shared and never added to: nothing is demoted when every record stays recent. */
const NONE_DEMOTED = new Set<number>();

function encodeCell(w: Writer, name: string, cell: Cell): void {
  const writes = cell.recent;
  const data = cell.recentData;
  const history = cell.history;
  const keep = recentCount(writes);
  // Records past `keep` join the history, with their values.
  const demoted = keep < writes.length ? new Set<number>() : NONE_DEMOTED;
  for (let i = keep; i < writes.length; i++)
    if (historyValue(writes[i]!, data)) demoted.add(writes[i]!.startTs);
  const hasHistory = history !== undefined || keep < writes.length;
  w.string(name);
  w.uint(
    (cell.lock ? 1 : 0) |
      (cell.notifyTs > 0 ? 2 : 0) |
      (cell.garbage.length > 0 ? 4 : 0) |
      (cell.notifyTs === STAMP ? 8 : 0) |
      (hasHistory ? 16 : 0),
  );
  w.uint(cell.prunedThrough);
  w.uint(data.size - demoted.size);
  for (const [ts, value] of data) {
    if (demoted.has(ts)) continue;
    // 0 (never a real timestamp): the value of a record whose startTs is the stamp.
    w.uint(ts === STAMP ? 0 : ts);
    w.bytes(value);
  }
  if (cell.lock) {
    const l = cell.lock;
    w.uint(l.startTs);
    w.string(l.primary.table);
    w.string(l.primary.row);
    w.string(l.primary.column);
    w.uint(l.kind === 'put' ? 0 : 1);
    w.uint(l.ttlMs);
    w.uint(l.wallTimeMs);
    writeRows(w, l.secondaries);
  }
  w.uint(keep);
  let base = 0;
  let newerWall = 0;
  for (let i = 0; i < keep; i++) {
    const rec = writes[i]!;
    const stamped = rec.commitTs === STAMP;
    const startStamped = stamped && rec.startTs === STAMP;
    const hasSecondaries = rec.secondaries !== undefined && rec.secondaries.length > 0;
    const anchored = isAnchored(rec);
    w.uint(
      KIND_BITS[rec.kind] |
        PLACE_BITS[rec.value] |
        (hasSecondaries ? 16 : 0) |
        (stamped ? 32 : 0) |
        (startStamped ? 64 : 0) |
        (anchored ? 128 : 0),
    );
    if (startStamped) {
      base = 0;
    } else if (stamped) {
      w.uint(rec.startTs);
      base = rec.startTs;
    } else {
      w.int(rec.commitTs - base);
      w.uint(rec.commitTs - rec.startTs);
      base = rec.commitTs;
    }
    if (i === 0) w.uint(rec.wallTimeMs);
    else w.int(newerWall - rec.wallTimeMs);
    if (hasSecondaries) writeRows(w, rec.secondaries);
    if (anchored) w.int(rec.block! - rec.startTs);
    newerWall = rec.wallTimeMs;
  }
  // A one-phase blind write to an observed column: its notification is stamped too.
  if (cell.notifyTs > 0 && cell.notifyTs !== STAMP) w.uint(cell.notifyTs);
  w.uint(cell.acks.size);
  for (const [observer, ts] of cell.acks) {
    w.string(observer);
    w.uint(ts);
  }
  if (cell.garbage.length > 0) {
    w.uint(cell.garbage.length);
    for (const ts of cell.garbage) w.uint(ts);
  }
  if (hasHistory) encodeHistory(w, history, writes, keep, data);
}

/** A wall time in a history header: 0 for none, else the time plus 1 (a hand-set clock may read 0). */
function writeWall(w: Writer, wall: number): void {
  w.uint(wall === Infinity ? 0 : wall + 1);
}

function readWall(r: Reader): number {
  const v = r.uint();
  return v === 0 ? Infinity : v - 1;
}

/** The value a record takes into the history: an `inline` or `moving` put's. */
function historyValue(rec: WriteRecord, data: ReadonlyMap<number, Uint8Array>): Uint8Array | undefined {
  return rec.kind === 'put' && rec.value !== 'moved' ? data.get(rec.startTs) : undefined;
}

/**
 * The history section: the stats, the bytes of the history as read (not decoded), then
 * `writes[keep..]`, oldest first, with their values.
 */
function encodeHistory(
  w: Writer,
  history: EncodedHistory | undefined,
  writes: readonly WriteRecord[],
  keep: number,
  data: ReadonlyMap<number, Uint8Array>,
): void {
  let count = history?.count ?? 0;
  let newestCommitTs = history?.newestCommitTs ?? 0;
  let newestWall = history?.newestWallTimeMs ?? 0;
  // The two smallest wall times of records that may be pruned, wall1 <= wall2 (Infinity: none).
  let wall1 = history ? history.prunableWalls[0] : Number.POSITIVE_INFINITY;
  let wall2 = history ? history.prunableWalls[1] : Number.POSITIVE_INFINITY;
  let inlineBytes = history?.inlineBytes ?? 0;
  let movingBytes = history?.movingBytes ?? 0;
  let moving = history?.moving ?? 0;
  let inline = history?.inline ?? 0;
  let held = history?.held ?? 0;
  for (let i = writes.length - 1; i >= keep; i--) {
    const rec = writes[i]!;
    if (rec.commitTs === STAMP || rec.startTs === STAMP)
      throw new Error('a stamped record cannot join the history');
    count++;
    const value = historyValue(rec, data);
    if (value && rec.value === 'inline') {
      inlineBytes += value.length;
      inline++;
    }
    if (value && rec.value === 'moving') movingBytes += value.length;
    if (rec.value === 'moving') moving++;
    if (rec.secondaries !== undefined && rec.secondaries.length > 0) held++;
    else if (rec.wallTimeMs < wall1) {
      wall2 = wall1;
      wall1 = rec.wallTimeMs;
    } else if (rec.wallTimeMs < wall2) wall2 = rec.wallTimeMs;
  }
  const at = w.reserve4();
  const from = w.pos;
  w.uint(count);
  // The newest record appended now, else the history's own newest.
  const newest = keep < writes.length ? writes[keep]! : undefined;
  w.uint(newest ? newest.commitTs : newestCommitTs);
  w.uint(newest ? newest.wallTimeMs : newestWall);
  writeWall(w, wall1);
  writeWall(w, wall2);
  w.uint(inlineBytes);
  w.uint(movingBytes);
  w.uint(moving);
  w.uint(inline);
  w.uint(held);
  if (history) w.raw(history.body);
  for (let i = writes.length - 1; i >= keep; i--) {
    const rec = writes[i]!;
    const hasSecondaries = rec.secondaries !== undefined && rec.secondaries.length > 0;
    const value = historyValue(rec, data);
    const anchored = isAnchored(rec);
    w.uint(
      KIND_BITS[rec.kind] |
        PLACE_BITS[rec.value] |
        (hasSecondaries ? 16 : 0) |
        (value ? 32 : 0) |
        (anchored ? 64 : 0),
    );
    w.int(rec.commitTs - newestCommitTs);
    w.uint(rec.commitTs - rec.startTs);
    w.int(rec.wallTimeMs - newestWall);
    if (hasSecondaries) writeRows(w, rec.secondaries);
    if (value) w.bytes(value);
    if (anchored) w.int(rec.block! - rec.startTs);
    newestCommitTs = rec.commitTs;
    newestWall = rec.wallTimeMs;
  }
  w.patch4(at, w.pos - from);
}

/** The format number a stored state starts with. */
export function formatOf(bytes: Uint8Array): number {
  return new Reader(bytes).uint();
}

/**
 * `decodeRow` of the head row (table, key): a CorruptRowError names the row, so that one
 * bad row in a scan (an operator's `locks`, a `dump`) can be found (found in review: the
 * message named a format and nothing else).
 */
export function decodeRowAt(bytes: Uint8Array, table: string, key: string): RowState {
  return atRow(table, key, () => decodeRow(bytes));
}

/** Runs `fn`; a CorruptRowError it throws is thrown again naming the row (table, key). */
export function atRow<T>(table: string, key: string, fn: () => T): T {
  try {
    return fn();
  } catch (error) {
    const at = `head row ${table}/${shownName(key)}: `;
    if (error instanceof CorruptRowError && !error.message.startsWith('head row ')) {
      throw new CorruptRowError(`${at}${error.message}`);
    }
    throw error;
  }
}

export function decodeRow(bytes: Uint8Array): RowState {
  const r = new Reader(bytes);
  const format = r.uint();
  if (format !== HEAD_FORMAT && format !== HEAD_FORMAT_3 && format !== HEAD_FORMAT_2) {
    throw new CorruptRowError(
      format === 1
        ? `row is in format 1 (the first version of percolator, one blob per row with every version); this version reads formats 2 to ${HEAD_FORMAT} only: rewrite the data with the version that wrote it`
        : `row is in format ${format}, which this version of percolator does not know (it reads head rows in formats 2 to ${HEAD_FORMAT})`,
    );
  }
  const flagLimit = format === HEAD_FORMAT_2 ? 16 : 32;
  // Anchored records (version blocks) exist from format 4 on.
  const recordLimit = format === HEAD_FORMAT ? 256 : 128;
  const historyLimit = format === HEAD_FORMAT ? 128 : 64;
  const stamp = r.fixed64();
  const cells = new Map<string, Cell>();
  const n = r.uint();
  for (let i = 0; i < n; i++) {
    const name = r.string();
    const flags = r.uint();
    if (flags >= flagLimit || (flags & 10) === 8)
      throw new CorruptRowError('row state has unknown cell flags');
    const prunedThrough = r.uint();
    const data = new Map<number, Uint8Array>();
    const nData = r.uint();
    for (let j = 0; j < nData; j++) {
      const ts = r.uint();
      if (ts === 0 && stamp === 0) throw new CorruptRowError('row state has a stamped value but no stamp');
      data.set(ts === 0 ? stamp : ts, r.bytes());
    }
    let lock: Lock | undefined;
    if (flags & 1) {
      const startTs = r.uint();
      const primary = { table: r.string(), row: r.string(), column: r.string() };
      const kindCode = r.uint();
      if (kindCode > 1) throw new CorruptRowError('row state has a lock of an unknown kind');
      const kind = kindCode === 0 ? 'put' : 'delete';
      const ttlMs = r.uint();
      const wallTimeMs = r.uint();
      lock = { startTs, primary, kind, ttlMs, wallTimeMs, secondaries: readRows(r) };
    }
    const writes: WriteRecord[] = [];
    const nWrites = r.uint();
    let base = 0;
    let wallTimeMs = 0;
    let prevExplicit = false;
    for (let j = 0; j < nWrites; j++) {
      const bits = r.uint();
      const kind = KINDS[bits & 3];
      const value = PLACES[(bits >> 2) & 3];
      if (!kind || !value || bits >= recordLimit || (bits & 96) === 64)
        throw new CorruptRowError('row state has an unknown write record kind');
      let commitTs: number;
      let startTs: number;
      if (bits & 64) {
        if (stamp === 0) throw new CorruptRowError('row state has a stamped record but no stamp');
        commitTs = stamp;
        startTs = stamp;
        base = 0;
      } else if (bits & 32) {
        if (stamp === 0) throw new CorruptRowError('row state has a stamped record but no stamp');
        commitTs = stamp;
        startTs = r.uint();
        base = startTs;
      } else {
        commitTs = base + r.int();
        startTs = commitTs - r.uint();
        base = commitTs;
      }
      // Newest first: visibleWrite and the conflict check stop at the first record that
      // fits, so a row whose records climb would read an older value as the newest. (Only
      // between records with timestamps of their own: a stamped record's comes from the
      // stamp slot, which in a state the client has not sent yet still holds the last stamp.)
      if (j > 0 && (bits & 96) === 0 && prevExplicit && commitTs > writes[j - 1]!.commitTs)
        throw new CorruptRowError('row state has write records out of commit order');
      prevExplicit = (bits & 96) === 0;
      wallTimeMs = j === 0 ? r.uint() : wallTimeMs - r.int();
      const secondaries = bits & 16 ? readRows(r) : undefined;
      const block = bits & 128 ? readAnchor(r, kind, value, startTs) : undefined;
      writes.push({ commitTs, startTs, kind, value, wallTimeMs, secondaries, block });
    }
    let notifyTs = 0;
    if (flags & 8) {
      if (stamp === 0) throw new CorruptRowError('row state has a stamped notification but no stamp');
      notifyTs = stamp;
    } else if (flags & 2) {
      notifyTs = r.uint();
    }
    const acks = new Map<string, number>();
    const nAcks = r.uint();
    for (let j = 0; j < nAcks; j++) {
      const observer = r.string();
      acks.set(observer, r.uint());
    }
    const garbage: number[] = [];
    if (flags & 4) {
      const nGarbage = r.uint();
      for (let j = 0; j < nGarbage; j++) garbage.push(r.uint());
    }
    let history: EncodedHistory | undefined;
    if (flags & 16) {
      history = readHistory(r, historyLimit);
      const last = writes.at(-1);
      if (!last || last.commitTs <= history.newestCommitTs)
        throw new CorruptRowError('row state has a history that is not older than its recent records');
    }
    const cell = new Cell(writes, data, history);
    cell.lock = lock;
    cell.prunedThrough = prunedThrough;
    cell.notifyTs = notifyTs;
    cell.acks = acks;
    cell.garbage = garbage;
    cells.set(name, cell);
  }
  // Bytes past the last cell would be dropped by the next write of the row: refuse them.
  if (r.pos !== bytes.length) throw new CorruptRowError('row state has bytes after its last cell');
  return { cells };
}

/**
 * A record's anchor (`WriteRecord.block`): only a `moving` or `moved` put has one, and it is
 * the largest startTs of its group, so above the record's own.
 */
function readAnchor(r: Reader, kind: RecordKind, place: ValuePlace, startTs: number): number {
  const offset = r.int();
  if (kind !== 'put' || place === 'inline' || offset <= 0)
    throw new CorruptRowError('row state has an anchor on a record that cannot have one');
  return startTs + offset;
}

/** A history section: its stats now, its records only when `decode` is called. */
function readHistory(r: Reader, bitsLimit: number): EncodedHistory {
  const length = r.uint();
  const section = r.take(length);
  const h = new Reader(section);
  const count = h.uint();
  const newestCommitTs = h.uint();
  const newestWallTimeMs = h.uint();
  const prunableWalls: [number, number] = [readWall(h), readWall(h)];
  const inlineBytes = h.uint();
  const movingBytes = h.uint();
  const moving = h.uint();
  const inline = h.uint();
  const held = h.uint();
  if (count === 0) throw new CorruptRowError('row state has an empty history');
  const body = section.subarray(h.pos);
  // A history read from a row before format 4 is checked now, not when decoded: a write
  // copies its bytes into a format 4 row, where a bit its own format refuses would read as
  // an anchor. Once per row: the next write makes it format 4.
  if (bitsLimit < 128) decodeHistory(body, count, newestCommitTs, bitsLimit);
  return {
    count,
    newestCommitTs,
    newestWallTimeMs,
    prunableWalls,
    inlineBytes,
    movingBytes,
    moving,
    inline,
    held,
    body,
    decode: () => decodeHistory(body, count, newestCommitTs, bitsLimit),
  };
}

function decodeHistory(
  body: Uint8Array,
  count: number,
  newestCommitTs: number,
  bitsLimit: number,
): { writes: WriteRecord[]; data: Map<number, Uint8Array> } {
  // Every record takes at least 4 bytes: a count past that is corrupt (and no huge allocation).
  if (count > body.length / 4) throw new CorruptRowError('row history does not match its header');
  const r = new Reader(body);
  const writes: WriteRecord[] = new Array(count);
  const data = new Map<number, Uint8Array>();
  let commitTs = 0;
  let wallTimeMs = 0;
  for (let i = count - 1; i >= 0; i--) {
    const bits = r.uint();
    const kind = KINDS[bits & 3];
    const value = PLACES[(bits >> 2) & 3];
    if (!kind || !value || bits >= bitsLimit)
      throw new CorruptRowError('row history has an unknown write record kind');
    commitTs += r.int();
    const startTs = commitTs - r.uint();
    wallTimeMs += r.int();
    const secondaries = bits & 16 ? readRows(r) : undefined;
    if (bits & 32) data.set(startTs, r.bytes());
    const block = bits & 64 ? readAnchor(r, kind, value, startTs) : undefined;
    writes[i] = { commitTs, startTs, kind, value, wallTimeMs, secondaries, block };
  }
  if (r.pos !== body.length || commitTs !== newestCommitTs)
    throw new CorruptRowError('row history does not match its header');
  return { writes, data };
}

/**
 * A version row holding a block of values (format 18; `stamped`: format 19, with the 8-byte
 * slot a stamped step writes its timestamp into), newest first.
 */
export function encodeVersionBlock(
  entries: readonly { readonly startTs: number; readonly value: Uint8Array }[],
  stamped = false,
): Uint8Array {
  let size = 24;
  for (const e of entries) size += e.value.length + 16;
  const w = new Writer(size);
  w.uint(stamped ? BLOCK_FORMAT_STAMPED : BLOCK_FORMAT);
  if (stamped) w.fixed64(0);
  w.uint(entries.length);
  for (const e of entries) {
    w.uint(e.startTs);
    w.bytes(e.value);
  }
  return w.result();
}

/**
 * A version row's header read: a reader at its body, and for a block its number of values
 * (undefined for formats 16 and 17, whose body is the one value). CorruptRowError for an
 * unknown format.
 */
function openVersionRow(bytes: Uint8Array): { r: Reader; count: number | undefined } {
  const r = new Reader(bytes);
  const format = r.uint();
  if (format === VERSION_FORMAT_STAMPED || format === BLOCK_FORMAT_STAMPED) r.take(8);
  else if (format !== VERSION_FORMAT && format !== BLOCK_FORMAT) {
    throw new CorruptRowError(
      `version row is in format ${format}; this version of percolator reads formats ${VERSION_FORMAT} to ${BLOCK_FORMAT_STAMPED}`,
    );
  }
  if (format === VERSION_FORMAT || format === VERSION_FORMAT_STAMPED) return { r, count: undefined };
  const count = r.uint();
  // Every entry takes at least 2 bytes: a count past that is corrupt.
  if (count > bytes.length / 2) throw new CorruptRowError('version block does not match its count');
  return { r, count };
}

/**
 * The value written at `startTs` that a version row holds: the row's only value (formats
 * 16 and 17), or the entry of a block (18 and 19); `undefined` if a block does not hold it.
 */
export function decodeVersionRow(bytes: Uint8Array, startTs: number): Uint8Array | undefined {
  const { r, count } = openVersionRow(bytes);
  if (count === undefined) return bytes.slice(r.pos);
  for (let i = 0; i < count; i++) {
    const ts = r.uint();
    const value = r.bytes();
    if (ts === startTs) return value.slice();
  }
  if (r.pos !== bytes.length) throw new CorruptRowError('version block does not match its count');
  return undefined;
}

/** The startTs and size of every value a version row holds: one, of unknown startTs, for formats 16 and 17. */
export function versionRowEntries(bytes: Uint8Array): { startTs: number | undefined; bytes: number }[] {
  const { r, count } = openVersionRow(bytes);
  if (count === undefined) return [{ startTs: undefined, bytes: bytes.length - r.pos }];
  const out: { startTs: number | undefined; bytes: number }[] = [];
  for (let i = 0; i < count; i++) out.push({ startTs: r.uint(), bytes: r.bytes().length });
  if (r.pos !== bytes.length) throw new CorruptRowError('version block does not match its count');
  return out;
}

/**
 * A version row of one value (format 16; `stamped`: 17), as written before blocks: read
 * still, written only by tests of that.
 */
export function encodeVersionRow(value: Uint8Array, stamped = false): Uint8Array {
  const w = new Writer(value.length + 12);
  w.uint(stamped ? VERSION_FORMAT_STAMPED : VERSION_FORMAT);
  if (stamped) w.fixed64(0);
  w.raw(value);
  return w.result();
}
