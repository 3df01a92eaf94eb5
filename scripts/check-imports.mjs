// The repository's import picture: no circle between modules (type-only imports count
// too), and nothing reaching into a package's internals: other packages are imported by
// their `exports` names (`@percolator/core`, `@percolator/testkit/redis`), never by
// `.../dist/...`, `.../src/...` or a relative path into them. Circles are checked within
// each package's src/; deep imports everywhere (packages, integration, examples, scripts).
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';

const ROOT = resolve(dirname(new URL(import.meta.url).pathname), '..');
// Every workspace package, from pnpm-workspace.yaml (`dir` and `dir/*` entries).
const PACKAGES = [
  ...readFileSync(join(ROOT, 'pnpm-workspace.yaml'), 'utf8').matchAll(/^\s*-\s*['"]?([^'"\s]+)['"]?\s*$/gm),
]
  .map((m) => m[1])
  .flatMap((pattern) =>
    pattern.endsWith('/*')
      ? readdirSync(join(ROOT, pattern.slice(0, -2)), { withFileTypes: true })
          .filter((e) => e.isDirectory())
          .map((e) => `${pattern.slice(0, -2)}/${e.name}`)
      : [pattern],
  )
  .filter((dir) => existsSync(join(ROOT, dir, 'package.json')));
const SPECIFIER =
  /(?:^|[\s;])(?:import|export)\s[^'"]*?from\s*['"]([^'"]+)['"]|import\(\s*['"]([^'"]+)['"]\s*\)/g;

function files(dir) {
  let out = [];
  let entries;
  try {
    entries = readdirSync(dir);
  } catch {
    return out;
  }
  for (const name of entries) {
    if (name === 'node_modules' || name === 'dist' || name.startsWith('.')) continue;
    const path = join(dir, name);
    if (statSync(path).isDirectory()) out = out.concat(files(path));
    else if (/\.(ts|mts|mjs)$/.test(name) && !name.endsWith('.d.ts')) out.push(path);
  }
  return out;
}

function specifiers(file) {
  const text = readFileSync(file, 'utf8').replace(/\/\*[\s\S]*?\*\/|(^|[^:])\/\/.*$/gm, '$1');
  return [...text.matchAll(SPECIFIER)].map((m) => m[1] ?? m[2]);
}

const problems = [];
const packageOf = (file) => PACKAGES.find((p) => file.startsWith(join(ROOT, p) + sep));

// Deep imports, everywhere.
const everything = [
  ...PACKAGES.flatMap((p) => files(join(ROOT, p))),
  ...files(join(ROOT, 'integration')),
  ...files(join(ROOT, 'examples')),
  ...files(join(ROOT, 'scripts')),
];
for (const file of everything) {
  const own = packageOf(file);
  for (const spec of specifiers(file)) {
    if (/^@percolator\/[^/]+\/(dist|src)(\/|$)/.test(spec))
      problems.push(`${relative(ROOT, file)}: deep import ${spec}`);
    if (spec.startsWith('.')) {
      // A relative path into another package (tests may use examples/ and scripts/).
      const into = packageOf(resolve(dirname(file), spec));
      if (into !== undefined && into !== own) {
        problems.push(`${relative(ROOT, file)}: reaches into ${into} by path: ${spec}`);
      }
    }
  }
}

// Circles, within each package's src/ (Tarjan's strongly connected components).
let modules = 0;
for (const pkg of PACKAGES) {
  const src = join(ROOT, pkg, 'src');
  const graph = new Map();
  for (const file of files(src)) {
    const edges = [];
    for (const spec of specifiers(file)) {
      if (!spec.startsWith('.')) continue;
      edges.push(resolve(dirname(file), spec).replace(/\.js$/, '.ts'));
    }
    graph.set(file, edges);
  }
  modules += graph.size;
  let index = 0;
  const stack = [];
  const info = new Map();
  const visit = (v) => {
    info.set(v, { index, low: index, on: true });
    index++;
    stack.push(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!info.has(w)) {
        visit(w);
        info.get(v).low = Math.min(info.get(v).low, info.get(w).low);
      } else if (info.get(w).on) info.get(v).low = Math.min(info.get(v).low, info.get(w).index);
    }
    if (info.get(v).low === info.get(v).index) {
      const component = [];
      let w;
      do {
        w = stack.pop();
        info.get(w).on = false;
        component.push(w);
      } while (w !== v);
      const selfLoop = (graph.get(v) ?? []).includes(v);
      if (component.length > 1 || selfLoop) {
        problems.push(`import circle: ${component.map((f) => relative(ROOT, f)).join(' <-> ')}`);
      }
    }
  };
  for (const v of graph.keys()) if (!info.has(v)) visit(v);
}

if (problems.length > 0) {
  for (const p of problems) console.error(p);
  process.exit(1);
}
console.log(`imports ok: ${modules} modules in ${PACKAGES.length} packages, no circle, no deep import`);
