import { randomBytes } from 'node:crypto';

/**
 * Version tokens. Choice: every write gets a fresh token = <128 random bits of this store
 * instance> "." <per-instance counter>, made by the client and passed to the CAS script.
 *
 * Why not a per-row counter: a counter kept in the row dies with the row, so after a delete
 * and re-create it would start again and a stale CAS could match (ABA). Keeping tombstones
 * (or a counter key per row) would avoid that but leaves a key behind for every row ever
 * deleted. A token that cannot repeat needs no state at all: the random prefix makes two
 * store instances (in any process, ever) collide with probability ~2^-128, and the counter
 * makes one instance's tokens distinct for sure.
 *
 * Client-made tokens also make a resent put recognisable: if the row's version already is
 * the token we are writing, that write was ours (see CAS_LUA).
 */
export class VersionTokens {
  private readonly prefix = randomBytes(16).toString('base64url');
  private counter = 0n;

  next(): string {
    this.counter += 1n;
    return `${this.prefix}.${this.counter.toString(36)}`;
  }
}
