/**
 * Thrown from a commit-step hook to make a client behave as if it crashed at that point:
 * no further store call, no rollback, no heartbeat. For tests and fault injection.
 */
export class ClientCrash extends Error {
  constructor(message = 'simulated client crash') {
    super(message);
    this.name = 'ClientCrash';
  }
}
