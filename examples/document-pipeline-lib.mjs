// The paper's document pipeline as two observers, shared by the runnable example
// (document-pipeline.mjs) and its test (core/test/observers-pipeline.test.ts).
//
//   documents/<url>/content  --(dedupe)-->  documents/<url>/hash
//                                           dups/<hash>/{members, canonical, words}
//   dups/<hash>/canonical    --(index)--->  word_index/<word>/<hash> = canonical url
//
// `dedupe` groups documents by a hash of their content; the canonical URL of a group is
// its smallest member. `index` maps every word of a group's content to the group's
// canonical URL (one cell per group, so groups never touch each other's cells).
import { createHash } from 'node:crypto';

export const DOCUMENTS = 'documents';
export const DUPS = 'dups';
export const INDEX = 'word_index';

/** Every client that writes these columns must list them (observedColumns). */
export const OBSERVED_COLUMNS = [
  { table: DOCUMENTS, column: 'content' },
  { table: DUPS, column: 'canonical' },
];

export function contentHash(content) {
  return createHash('sha256').update(content).digest('hex').slice(0, 16);
}

export function wordsOf(content) {
  return [
    ...new Set(
      content
        .toLowerCase()
        .split(/[^\p{L}\p{N}]+/u)
        .filter(Boolean),
    ),
  ].sort();
}

const json = (text, fallback) => (text === undefined ? fallback : JSON.parse(text));

async function leaveGroup(tx, hash, url) {
  const members = json(await tx.getString(DUPS, hash, 'members'), []).filter((m) => m !== url);
  if (members.length === 0) {
    // The group is gone; `index` sees the canonical deleted and removes its entries.
    tx.delete(DUPS, hash, 'members');
    tx.delete(DUPS, hash, 'canonical');
    tx.delete(DUPS, hash, 'words');
    return;
  }
  tx.set(DUPS, hash, 'members', JSON.stringify(members));
  if ((await tx.getString(DUPS, hash, 'canonical')) !== members[0])
    tx.set(DUPS, hash, 'canonical', members[0]);
}

async function joinGroup(tx, hash, url, content) {
  const members = json(await tx.getString(DUPS, hash, 'members'), []);
  if (!members.includes(url)) members.push(url);
  members.sort();
  tx.set(DUPS, hash, 'members', JSON.stringify(members));
  tx.set(DUPS, hash, 'words', JSON.stringify(wordsOf(content)));
  if ((await tx.getString(DUPS, hash, 'canonical')) !== members[0])
    tx.set(DUPS, hash, 'canonical', members[0]);
}

/** Runs when a document's content changes: keeps its hash and its duplicate group. */
export const dedupeObserver = {
  name: 'dedupe',
  table: DOCUMENTS,
  column: 'content',
  handler: async (tx, { row: url }) => {
    const content = await tx.getString(DOCUMENTS, url, 'content');
    const oldHash = await tx.getString(DOCUMENTS, url, 'hash');
    const newHash = content === undefined ? undefined : contentHash(content);
    if (oldHash === newHash) return;
    if (oldHash !== undefined) await leaveGroup(tx, oldHash, url);
    if (newHash === undefined) tx.delete(DOCUMENTS, url, 'hash');
    else {
      await joinGroup(tx, newHash, url, content);
      tx.set(DOCUMENTS, url, 'hash', newHash);
    }
  },
};

/** Runs when a group's canonical URL changes (triggered by `dedupe`): keeps the word index. */
export const indexObserver = {
  name: 'index',
  table: DUPS,
  column: 'canonical',
  handler: async (tx, { row: hash }) => {
    const canonical = await tx.getString(DUPS, hash, 'canonical');
    const words = canonical === undefined ? [] : json(await tx.getString(DUPS, hash, 'words'), []);
    const indexed = json(await tx.getString(DUPS, hash, 'indexed'), { url: undefined, words: [] });
    for (const word of indexed.words) if (!words.includes(word)) tx.delete(INDEX, word, hash);
    for (const word of words) {
      if (indexed.url !== canonical || !indexed.words.includes(word)) tx.set(INDEX, word, hash, canonical);
    }
    if (canonical === undefined) tx.delete(DUPS, hash, 'indexed');
    else tx.set(DUPS, hash, 'indexed', JSON.stringify({ url: canonical, words }));
  },
};

export const pipelineObservers = [dedupeObserver, indexObserver];

/** A small seeded generator (mulberry32), so a workload can be repeated. */
export function seededRandom(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const VOCABULARY = ['percolator', 'bigtable', 'snapshot', 'isolation', 'observer', 'notify', 'ack', 'lock'];

/** A few distinct contents, so documents often share one (duplicates). */
export function sampleContents(count, random) {
  return Array.from({ length: count }, (_, i) => {
    const words = Array.from({ length: 2 + Math.floor(random() * 3) }, () => {
      return VOCABULARY[Math.floor(random() * VOCABULARY.length)];
    });
    return `${words.join(' ')} #${i}`;
  });
}

/**
 * Random document inserts, updates and deletes from several writer clients at once.
 * Returns how many transactions committed.
 */
export async function randomDocumentWrites(
  writers,
  { seed = 1, operations = 200, urls = 24, contents = 6, pauseMs = 0 },
) {
  const random = seededRandom(seed);
  const texts = sampleContents(contents, random);
  const plan = Array.from({ length: operations }, () => ({
    url: `https://example.com/${Math.floor(random() * urls)}`,
    content: random() < 0.15 ? undefined : texts[Math.floor(random() * texts.length)],
    writer: Math.floor(random() * writers.length),
    pause: random() * pauseMs,
  }));
  let committed = 0;
  await Promise.all(
    writers.map(async (db, w) => {
      for (const op of plan.filter((p) => p.writer === w)) {
        // An optional pause spreads the writes out so they overlap observer runs.
        if (op.pause > 0) await new Promise((resolve) => setTimeout(resolve, op.pause));
        await db.transact(async (tx) => {
          if (op.content === undefined) tx.delete(DOCUMENTS, op.url, 'content');
          else tx.set(DOCUMENTS, op.url, 'content', op.content);
        });
        committed++;
      }
    }),
  );
  return committed;
}

async function readTable(tx, table) {
  const rows = new Map();
  const decoder = new TextDecoder();
  for await (const { row, columns } of tx.scan(table)) {
    rows.set(row, new Map([...columns].map(([c, v]) => [c, decoder.decode(v)])));
  }
  return rows;
}

/**
 * Checks the pipeline's invariants in one snapshot; returns the violations (empty when
 * everything derived matches the documents). Meaningful once the workers are idle.
 */
export async function checkPipeline(db) {
  const { documents, dups, index } = await db.transact(async (tx) => ({
    documents: await readTable(tx, DOCUMENTS),
    dups: await readTable(tx, DUPS),
    index: await readTable(tx, INDEX),
  }));
  const problems = [];
  const groups = new Map();
  for (const [url, columns] of documents) {
    const content = columns.get('content');
    const expected = content === undefined ? undefined : contentHash(content);
    if (columns.get('hash') !== expected)
      problems.push(`documents/${url}: hash ${columns.get('hash')}, expected ${expected}`);
    if (content !== undefined) {
      const group = groups.get(expected) ?? { members: [], content };
      group.members.push(url);
      groups.set(expected, group);
    }
  }
  const expectedIndex = new Map();
  for (const [hash, group] of groups) {
    group.members.sort();
    const row = dups.get(hash);
    const canonical = group.members[0];
    if (row?.get('members') !== JSON.stringify(group.members)) {
      problems.push(
        `dups/${hash}: members ${row?.get('members')}, expected ${JSON.stringify(group.members)}`,
      );
    }
    if (row?.get('canonical') !== canonical)
      problems.push(`dups/${hash}: canonical ${row?.get('canonical')}, expected ${canonical}`);
    for (const word of wordsOf(group.content)) expectedIndex.set(`${word} ${hash}`, canonical);
  }
  for (const [hash, row] of dups) {
    if (!groups.has(hash) && (row.has('members') || row.has('canonical') || row.has('indexed'))) {
      problems.push(`dups/${hash}: a group with no documents is still there`);
    }
  }
  const actualIndex = new Map();
  for (const [word, columns] of index)
    for (const [hash, url] of columns) actualIndex.set(`${word} ${hash}`, url);
  for (const [key, url] of expectedIndex) {
    if (actualIndex.get(key) !== url)
      problems.push(`word_index ${key}: ${actualIndex.get(key)}, expected ${url}`);
  }
  for (const [key, url] of actualIndex) {
    if (!expectedIndex.has(key)) problems.push(`word_index ${key}: stale entry ${url}`);
  }
  return { problems, documents: documents.size, groups: groups.size, indexEntries: actualIndex.size };
}
