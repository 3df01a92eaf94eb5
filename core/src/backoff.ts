/** Full-jitter exponential backoff: random in [0, min(cap, base * 2^attempt)]. */
export function backoffMs(attempt: number, baseMs = 2, capMs = 200): number {
  return Math.random() * Math.min(capMs, baseMs * 2 ** Math.min(attempt, 16));
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
