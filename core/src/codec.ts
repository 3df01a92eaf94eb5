import type { Cell, Lock, RecordKind, RowState, WriteRecord } from './row-state.js';

/**
 * Binary encoding of a RowState. Compact and fast because every protocol step decodes
 * and re-encodes a whole row. Layout (all integers are unsigned LEB128 varints, which
 * hold any safe integer):
 *   u8 format=1, n cells, per cell: name, flags(bit0 lock, bit1 notify), prunedThrough,
 *   n data {startTs, bytes}, [lock {startTs, table, row, column, kind, ttlMs, wallTimeMs}],
 *   n writes {commitTs, startTs, kind|pending<<2, wallTimeMs}, [notifyTs], n acks {name, ts}.
 */
const FORMAT = 1;
const KINDS: RecordKind[] = ['put', 'delete', 'rollback'];
const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { fatal: true });

class Writer {
  buf = new Uint8Array(256);
  pos = 0;
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
    while (v >= 0x80) {
      this.buf[this.pos++] = (v % 0x80) | 0x80;
      v = Math.floor(v / 0x80);
    }
    this.buf[this.pos++] = v;
  }
  bytes(value: Uint8Array): void {
    this.uint(value.length);
    this.ensure(value.length);
    this.buf.set(value, this.pos);
    this.pos += value.length;
  }
  string(value: string): void {
    // Encode in place after room for the longest length prefix, then slide it down.
    this.ensure(value.length * 3 + 16);
    const start = this.pos + 8;
    const { written } = encoder.encodeInto(value, this.buf.subarray(start));
    this.uint(written);
    this.buf.copyWithin(this.pos, start, start + written);
    this.pos += written;
  }
  result(): Uint8Array {
    return this.buf.slice(0, this.pos);
  }
}

class Reader {
  pos = 0;
  constructor(private readonly buf: Uint8Array) {}
  uint(): number {
    let result = 0;
    let scale = 1;
    for (;;) {
      if (this.pos >= this.buf.length) throw new Error('row state is truncated');
      const b = this.buf[this.pos++]!;
      result += (b & 0x7f) * scale;
      if (b < 0x80) return result;
      scale *= 0x80;
    }
  }
  bytes(): Uint8Array {
    const n = this.uint();
    if (this.pos + n > this.buf.length) throw new Error('row state is truncated');
    const out = this.buf.slice(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }
  string(): string {
    const n = this.uint();
    if (this.pos + n > this.buf.length) throw new Error('row state is truncated');
    const out = decoder.decode(this.buf.subarray(this.pos, this.pos + n));
    this.pos += n;
    return out;
  }
}

export function encodeRow(row: RowState): Uint8Array {
  const w = new Writer();
  w.uint(FORMAT);
  w.uint(row.cells.size);
  for (const [name, cell] of row.cells) {
    w.string(name);
    w.uint((cell.lock ? 1 : 0) | (cell.notifyTs > 0 ? 2 : 0));
    w.uint(cell.prunedThrough);
    w.uint(cell.data.size);
    for (const [ts, value] of cell.data) {
      w.uint(ts);
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
    }
    w.uint(cell.writes.length);
    for (const rec of cell.writes) {
      w.uint(rec.commitTs);
      w.uint(rec.startTs);
      w.uint(KINDS.indexOf(rec.kind) | (rec.secondariesPending ? 4 : 0));
      w.uint(rec.wallTimeMs);
    }
    if (cell.notifyTs > 0) w.uint(cell.notifyTs);
    w.uint(cell.acks.size);
    for (const [observer, ts] of cell.acks) {
      w.string(observer);
      w.uint(ts);
    }
  }
  return w.result();
}

export function decodeRow(bytes: Uint8Array): RowState {
  const r = new Reader(bytes);
  const format = r.uint();
  if (format !== FORMAT) throw new Error(`unknown row state format ${format}`);
  const cells = new Map<string, Cell>();
  const n = r.uint();
  for (let i = 0; i < n; i++) {
    const name = r.string();
    const flags = r.uint();
    const prunedThrough = r.uint();
    const data = new Map<number, Uint8Array>();
    const nData = r.uint();
    for (let j = 0; j < nData; j++) {
      const ts = r.uint();
      data.set(ts, r.bytes());
    }
    let lock: Lock | undefined;
    if (flags & 1) {
      const startTs = r.uint();
      const primary = { table: r.string(), row: r.string(), column: r.string() };
      const kind = r.uint() === 0 ? 'put' : 'delete';
      lock = { startTs, primary, kind, ttlMs: r.uint(), wallTimeMs: r.uint() };
    }
    const writes: WriteRecord[] = [];
    const nWrites = r.uint();
    for (let j = 0; j < nWrites; j++) {
      const commitTs = r.uint();
      const startTs = r.uint();
      const kindBits = r.uint();
      const kind = KINDS[kindBits & 3];
      if (!kind) throw new Error('row state has an unknown write kind');
      writes.push({
        commitTs,
        startTs,
        kind,
        secondariesPending: (kindBits & 4) !== 0,
        wallTimeMs: r.uint(),
      });
    }
    const notifyTs = flags & 2 ? r.uint() : 0;
    const acks = new Map<string, number>();
    const nAcks = r.uint();
    for (let j = 0; j < nAcks; j++) {
      const observer = r.string();
      acks.set(observer, r.uint());
    }
    cells.set(name, { data, lock, writes, prunedThrough, notifyTs, acks });
  }
  return { cells };
}
