/**
 * A small directed multigraph over transaction ids, with labelled edges, plus the two
 * searches Elle uses: strongly connected components (Tarjan) and a breadth-first search
 * for a short cycle inside one component.
 */

/** rt: the first transaction completed (committed) before the second was invoked. */
export type EdgeKind = 'ww' | 'wr' | 'rw' | 'rt';

export interface EdgeLabel {
  readonly kind: EdgeKind;
  /** The key whose versions gave this dependency ('' for rt). */
  readonly key: string;
}

export interface CycleStep {
  readonly from: number;
  readonly to: number;
  readonly kind: EdgeKind;
  readonly key: string;
}

export class DependencyGraph {
  private readonly out = new Map<number, Map<number, EdgeLabel[]>>();

  addNode(node: number): void {
    if (!this.out.has(node)) this.out.set(node, new Map());
  }

  addEdge(from: number, to: number, label: EdgeLabel): void {
    if (from === to) return;
    this.addNode(from);
    this.addNode(to);
    const targets = this.out.get(from)!;
    const labels = targets.get(to);
    if (labels === undefined) targets.set(to, [label]);
    else if (!labels.some((l) => l.kind === label.kind && l.key === label.key)) labels.push(label);
  }

  nodes(): number[] {
    return [...this.out.keys()];
  }

  labels(from: number, to: number): readonly EdgeLabel[] {
    return this.out.get(from)?.get(to) ?? [];
  }

  /** Successors of `node` over edges that have at least one label of an allowed kind. */
  *successors(node: number, allowed: ReadonlySet<EdgeKind>): Iterable<number> {
    const targets = this.out.get(node);
    if (targets === undefined) return;
    for (const [to, labels] of targets) {
      if (labels.some((l) => allowed.has(l.kind))) yield to;
    }
  }

  edgeCount(): number {
    let n = 0;
    for (const targets of this.out.values()) n += targets.size;
    return n;
  }
}

export const ALL_KINDS: ReadonlySet<EdgeKind> = new Set(['ww', 'wr', 'rw', 'rt']);

/**
 * Tarjan's algorithm, iterative so long histories cannot overflow the stack. Returns only
 * components with more than one node (a single node has no cycle: self-edges are dropped).
 */
export function stronglyConnectedComponents(
  graph: DependencyGraph,
  allowed: ReadonlySet<EdgeKind> = ALL_KINDS,
  within?: ReadonlySet<number>,
): number[][] {
  const index = new Map<number, number>();
  const low = new Map<number, number>();
  const onStack = new Set<number>();
  const stack: number[] = [];
  const components: number[][] = [];
  let counter = 0;
  const inScope = (n: number) => within === undefined || within.has(n);

  for (const root of within ?? graph.nodes()) {
    if (index.has(root)) continue;
    // Each frame: the node and an iterator over its remaining successors.
    const frames: { node: number; next: Iterator<number> }[] = [];
    const open = (node: number) => {
      index.set(node, counter);
      low.set(node, counter);
      counter++;
      stack.push(node);
      onStack.add(node);
      frames.push({ node, next: graph.successors(node, allowed)[Symbol.iterator]() });
    };
    open(root);
    while (frames.length > 0) {
      const frame = frames[frames.length - 1]!;
      const step = frame.next.next();
      if (!step.done) {
        const to = step.value;
        if (!inScope(to)) continue;
        if (!index.has(to)) open(to);
        else if (onStack.has(to)) low.set(frame.node, Math.min(low.get(frame.node)!, index.get(to)!));
        continue;
      }
      frames.pop();
      const parent = frames[frames.length - 1];
      if (parent !== undefined) low.set(parent.node, Math.min(low.get(parent.node)!, low.get(frame.node)!));
      if (low.get(frame.node) === index.get(frame.node)) {
        const component: number[] = [];
        let member: number;
        do {
          member = stack.pop()!;
          onStack.delete(member);
          component.push(member);
        } while (member !== frame.node);
        if (component.length > 1) components.push(component);
      }
    }
  }
  return components;
}

/**
 * Shortest path (breadth-first) from `from` to `to` over allowed edges, staying inside
 * `within`. Returns the node sequence including both ends, or undefined.
 */
export function shortestPath(
  graph: DependencyGraph,
  from: number,
  to: number,
  allowed: ReadonlySet<EdgeKind>,
  within: ReadonlySet<number>,
): number[] | undefined {
  if (from === to) return [from];
  const parent = new Map<number, number>([[from, from]]);
  let frontier = [from];
  while (frontier.length > 0) {
    const next: number[] = [];
    for (const node of frontier) {
      for (const succ of graph.successors(node, allowed)) {
        if (!within.has(succ) || parent.has(succ)) continue;
        parent.set(succ, node);
        if (succ === to) {
          const path = [to];
          let cur = to;
          while (cur !== from) {
            cur = parent.get(cur)!;
            path.push(cur);
          }
          return path.reverse();
        }
        next.push(succ);
      }
    }
    frontier = next;
  }
  return undefined;
}

/** Turns a closed node path (first node repeated at the end) into labelled steps. */
export function labelCycle(
  graph: DependencyGraph,
  path: readonly number[],
  preference: readonly EdgeKind[],
): CycleStep[] {
  const steps: CycleStep[] = [];
  for (let i = 0; i + 1 < path.length; i++) {
    const from = path[i]!;
    const to = path[i + 1]!;
    const labels = graph.labels(from, to);
    const label = preference.map((k) => labels.find((l) => l.kind === k)).find((l) => l !== undefined);
    if (label === undefined) throw new Error(`no edge ${from} -> ${to} of kinds ${preference.join(',')}`);
    steps.push({ from, to, kind: label.kind, key: label.key });
  }
  return steps;
}
