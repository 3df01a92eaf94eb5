import { randomBytes } from 'node:crypto';
import { StoreError } from '@percolator/core';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { isConnectionBroken, readError, writeError } from '../src/errors.js';
import { admin, usePostgresFixture } from './fixture.js';

/*
 * The failure mapping on a server whose messages are not in English. PostgreSQL translates
 * the severity field (S) with lc_messages; pg copies only that one onto its DatabaseError.
 * This machine has no locale but C/POSIX (`locale -a`), so no server with translated
 * messages can be started here: the errors below are pg DatabaseErrors made as pg-protocol's
 * parser makes them, with the severity words of PostgreSQL 15's own message catalogs
 * (/usr/share/locale/<lang>/LC_MESSAGES/postgres-15.mo), and, last, a real server error with
 * its severity replaced by a translation.
 */

/** The words PostgreSQL 15's catalogs use for ERROR, FATAL and PANIC, per language. */
const TRANSLATIONS: Record<string, { error: string; fatal: string; panic: string }> = {
  de: { error: 'FEHLER', fatal: 'FATAL', panic: 'PANIK' },
  fr: { error: 'ERREUR', fatal: 'FATAL', panic: 'PANIC' },
  it: { error: 'ERRORE', fatal: 'FATALE', panic: 'PANICO' },
  ka: { error: 'შეცდომა', fatal: 'ფატალური', panic: 'პანიკა' },
  ko: { error: '오류', fatal: '치명적오류', panic: '손상' },
  ru: { error: 'ОШИБКА', fatal: 'ВАЖНО', panic: 'ПАНИКА' },
  sv: { error: 'FEL', fatal: 'FATALT', panic: 'PANIK' },
  uk: { error: 'ПОМИЛКА', fatal: 'ФАТАЛЬНО', panic: 'ПАНІКА' },
  zh_CN: { error: '错误', fatal: '致命错误', panic: '灾难性错误' },
  zh_TW: { error: '錯誤', fatal: '致命錯誤', panic: '嚴重錯誤' },
};

/** A pg DatabaseError as pg-protocol's parseErrorMessage builds one from fields M, S, C. */
function serverError(severity: string | undefined, code: string | undefined, message = 'x'): Error {
  const error = new pg.DatabaseError(message, 0, 'error') as Error & { severity?: string; code?: string };
  error.severity = severity;
  error.code = code;
  return error;
}

function outcome(error: unknown): { applied: string; broken: boolean } {
  return { applied: writeError('a write', error).applied, broken: isConnectionBroken(error) };
}

const rolledBack = { applied: 'no', broken: false };
const maybeApplied = { applied: 'unknown', broken: true };

/** SQLSTATEs only ever sent with ERROR, so the statement was rolled back. */
const ERROR_ONLY = [
  '23505', // unique_violation
  '22P02', // invalid_text_representation
  '42P01', // undefined_table
  '40001', // serialization_failure (retried)
  '40P01', // deadlock_detected (retried)
  '55P03', // lock_not_available (lock_timeout)
  'PC409', // the stamped multi-row CAS's own "row changed" (schema.ts)
];

/** SQLSTATEs that can come with FATAL or PANIC, or after a commit landed. */
const MAYBE_AFTER_COMMIT = [
  '08006', // connection_failure
  '08P01', // protocol_violation
  '57P01', // admin_shutdown (pg_terminate_backend)
  '57P04', // database_dropped
  '57P05', // idle_session_timeout
  '57014', // query_canceled
  '25P03', // idle_in_transaction_session_timeout
  '25P04', // transaction_timeout (17+)
  '53100', // disk_full (WAL write, PANIC)
  '53200', // out_of_memory (in a critical section, PANIC)
  '58030', // io_error (fsync, PANIC)
  '58P01', // undefined_file
  'XX000', // internal_error ("cannot abort transaction ..., it was already committed")
  '42501', // errcode_for_file_access: EACCES, EROFS (a WAL write, PANIC)
  '42809', // errcode_for_file_access: ENOTDIR, EISDIR
];

describe('postgres failure mapping with translated severities', () => {
  for (const [lang, words] of Object.entries(TRANSLATIONS)) {
    it(`${lang}: an error with a SQLSTATE only ERROR carries was rolled back, the connection kept`, () => {
      for (const code of ERROR_ONLY) {
        expect({ code, ...outcome(serverError(words.error, code)) }).toEqual({ code, ...rolledBack });
      }
    });

    it(`${lang}: a SQLSTATE that can come with FATAL/PANIC or after a commit may have applied, whatever the word`, () => {
      for (const code of MAYBE_AFTER_COMMIT) {
        for (const word of [words.error, words.fatal, words.panic]) {
          expect({ code, word, ...outcome(serverError(word, code)) }).toEqual({
            code,
            word,
            ...maybeApplied,
          });
        }
      }
    });
  }

  it('English severities keep their meaning: FATAL and PANIC may have applied whatever the code', () => {
    expect(outcome(serverError('ERROR', '23505'))).toEqual(rolledBack);
    expect(outcome(serverError('ERROR', '57014'))).toEqual(maybeApplied);
    expect(outcome(serverError('ERROR', '08006'))).toEqual(maybeApplied);
    expect(outcome(serverError('FATAL', '40001'))).toEqual(maybeApplied);
    expect(outcome(serverError('PANIC', '23505'))).toEqual(maybeApplied);
    // Italian's FATAL is a word of its own, but French and German keep FATAL/PANIC.
    expect(outcome(serverError(TRANSLATIONS.de!.fatal, '23505'))).toEqual(maybeApplied);
    expect(outcome(serverError(TRANSLATIONS.fr!.panic, '23505'))).toEqual(maybeApplied);
  });

  it('an error that is not a server answer (no severity, or no SQLSTATE) may have applied', () => {
    const socket = Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' });
    expect(outcome(socket)).toEqual(maybeApplied);
    expect(outcome(Object.assign(new Error('write EPIPE'), { code: 'EPIPE' }))).toEqual(maybeApplied);
    expect(outcome(new Error('Connection terminated unexpectedly'))).toEqual(maybeApplied);
    expect(outcome(serverError('FEHLER', undefined))).toEqual(maybeApplied);
    expect(outcome(serverError('FEHLER', 'ECONNRESET'))).toEqual(maybeApplied);
    expect(outcome(serverError('FEHLER', '2350'))).toEqual(maybeApplied);
    expect(outcome(serverError('', '23505'))).toEqual(maybeApplied);
    expect(outcome(undefined)).toEqual(maybeApplied);
    expect(outcome('23505')).toEqual(maybeApplied);
  });

  it('a read fails with "no" and a write that may be partly applied with "unknown", whatever the word', () => {
    expect(readError('a read', serverError('FEHLER', '57P01')).applied).toBe('no');
    const partly = writeError('a batch', serverError('FEHLER', '23505'), true);
    expect(partly).toBeInstanceOf(StoreError);
    expect(partly.applied).toBe('unknown');
  });
});

usePostgresFixture('terr');

describe('postgres failure mapping: a real server error with its severity translated', () => {
  it('a unique violation from the server is "no" in English and translated alike', async () => {
    const table = `terr_${randomBytes(6).toString('hex')}`;
    const client = await admin.connect();
    try {
      await client.query(`CREATE TEMP TABLE ${table} (k int PRIMARY KEY)`);
      await client.query(`INSERT INTO ${table} VALUES (1)`);
      const error = (await client
        .query(`INSERT INTO ${table} VALUES (1)`)
        .catch((e: unknown) => e)) as Error & {
        severity?: string;
        code?: string;
      };
      expect(error).toBeInstanceOf(pg.DatabaseError);
      expect([error.severity, error.code]).toEqual(['ERROR', '23505']);
      // Only S holds the word: pg does not copy V (untranslated) onto the error. If a pg
      // release does, the classification should read V instead (errors.ts).
      expect(Object.entries(error).filter(([, value]) => value === 'ERROR')).toEqual([['severity', 'ERROR']]);
      expect(outcome(error)).toEqual(rolledBack);
      for (const words of Object.values(TRANSLATIONS)) {
        error.severity = words.error;
        expect(outcome(error)).toEqual(rolledBack);
      }
    } finally {
      client.release(true);
    }
  });
});
