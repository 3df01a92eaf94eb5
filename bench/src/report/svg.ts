/** Tiny SVG chart builders for the self-contained HTML report (no scripts, no external assets). */

export function esc(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

export interface Bar {
  readonly name: string;
  readonly value: number;
  readonly text: string;
  readonly color: string;
}

export interface BarGroup {
  readonly label: string;
  readonly bars: readonly Bar[];
}

export interface ReferenceLine {
  readonly value: number;
  readonly label: string;
}

/**
 * Horizontal grouped bars. `scale: 'group'` sizes bars relative to the largest in their
 * group (comparing modes within a workload); `'shared'` uses one axis for all.
 */
export function barChart(
  groups: readonly BarGroup[],
  options: {
    scale: 'group' | 'shared';
    references?: readonly ReferenceLine[];
    width?: number;
    /** Room right of the longest bar for its text. */
    textWidth?: number;
  } = {
    scale: 'group',
  },
): string {
  const width = options.width ?? 820;
  const labelWidth = 150;
  const textWidth = options.textWidth ?? 230;
  const barHeight = 14;
  const gap = 10;
  const plot = width - labelWidth - textWidth;
  const sharedMax = Math.max(
    1e-9,
    ...groups.flatMap((g) => g.bars.map((b) => b.value)),
    ...(options.references ?? []).map((r) => r.value),
  );
  let y = 8;
  const parts: string[] = [];
  for (const group of groups) {
    const max = options.scale === 'shared' ? sharedMax : Math.max(1e-9, ...group.bars.map((b) => b.value));
    const top = y;
    for (const bar of group.bars) {
      const w = Math.max(1, (bar.value / max) * plot);
      parts.push(
        `<rect x="${labelWidth}" y="${y}" width="${w.toFixed(1)}" height="${barHeight}" fill="${bar.color}"><title>${esc(`${group.label} ${bar.name}: ${bar.text}`)}</title></rect>`,
        `<text x="${(labelWidth + w + 4).toFixed(1)}" y="${y + barHeight - 3}" class="v">${esc(`${bar.name}: ${bar.text}`)}</text>`,
      );
      y += barHeight + 2;
    }
    const mid = (top + y) / 2 + 4;
    parts.push(
      `<text x="${labelWidth - 6}" y="${mid.toFixed(1)}" text-anchor="end" class="l">${esc(group.label)}</text>`,
    );
    y += gap;
  }
  if (options.scale === 'shared') {
    for (const ref of options.references ?? []) {
      const x = labelWidth + (ref.value / sharedMax) * plot;
      parts.push(
        `<line x1="${x.toFixed(1)}" x2="${x.toFixed(1)}" y1="2" y2="${y - gap}" stroke="#555" stroke-dasharray="4 3"/>`,
        `<text x="${(x + 3).toFixed(1)}" y="${y + 4}" class="v">${esc(ref.label)}</text>`,
      );
    }
    y += 12;
  }
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${y}" viewBox="0 0 ${width} ${y}">${parts.join('')}</svg>`;
}

export interface Series {
  readonly name: string;
  readonly color: string;
  readonly points: ReadonlyArray<readonly [number, number]>;
}

/** A line chart with log-scaled axes where asked (every value must then be > 0). */
export function lineChart(
  series: readonly Series[],
  options: { xLabel: string; yLabel: string; xLog?: boolean; yLog?: boolean; yMax?: number; width?: number },
): string {
  const width = options.width ?? 580;
  const height = 260;
  const m = { left: 64, right: 200, top: 12, bottom: 40 };
  const pw = width - m.left - m.right;
  const ph = height - m.top - m.bottom;
  const all = series.flatMap((s) => s.points);
  if (all.length === 0) return '';
  const tx = (v: number) => (options.xLog ? Math.log10(v) : v);
  const ty = (v: number) => (options.yLog ? Math.log10(Math.max(v, 1e-3)) : v);
  const xs = all.map(([x]) => tx(x));
  const ys = all.map(([, y]) => ty(y));
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [
    options.yLog ? Math.min(...ys) : 0,
    options.yMax !== undefined ? ty(options.yMax) : Math.max(...ys),
  ];
  if (x1 === x0) [x0, x1] = [x0 - 1, x1 + 1];
  if (y1 === y0) [y0, y1] = [y0 - 1, y1 + 1];
  const px = (x: number) => m.left + ((tx(x) - x0) / (x1 - x0)) * pw;
  const py = (y: number) => m.top + ph - ((ty(y) - y0) / (y1 - y0)) * ph;
  const parts: string[] = [
    `<rect x="${m.left}" y="${m.top}" width="${pw}" height="${ph}" fill="none" stroke="#ccc"/>`,
  ];
  const xTicks = [...new Set(all.map(([x]) => x))].sort((a, b) => a - b);
  for (const x of xTicks) {
    parts.push(
      `<text x="${px(x).toFixed(1)}" y="${m.top + ph + 14}" text-anchor="middle" class="v">${esc(String(x))}</text>`,
    );
  }
  for (let i = 0; i <= 4; i++) {
    const v = y0 + ((y1 - y0) * i) / 4;
    const value = options.yLog ? 10 ** v : v;
    const y = m.top + ph - (ph * i) / 4;
    parts.push(
      `<line x1="${m.left}" x2="${m.left + pw}" y1="${y}" y2="${y}" stroke="#eee"/>`,
      `<text x="${m.left - 4}" y="${y + 4}" text-anchor="end" class="v">${esc(compact(value))}</text>`,
    );
  }
  parts.push(
    `<text x="${m.left + pw / 2}" y="${height - 6}" text-anchor="middle" class="l">${esc(options.xLabel)}</text>`,
    `<text x="12" y="${m.top + ph / 2}" transform="rotate(-90 12 ${m.top + ph / 2})" text-anchor="middle" class="l">${esc(options.yLabel)}</text>`,
  );
  series.forEach((s, i) => {
    const pts = [...s.points].sort((a, b) => a[0] - b[0]);
    const d = pts
      .map(([x, y], j) => `${j === 0 ? 'M' : 'L'}${px(x).toFixed(1)},${py(y).toFixed(1)}`)
      .join('');
    parts.push(`<path d="${d}" fill="none" stroke="${s.color}" stroke-width="2"/>`);
    for (const [x, y] of pts) {
      parts.push(
        `<circle cx="${px(x).toFixed(1)}" cy="${py(y).toFixed(1)}" r="3" fill="${s.color}"><title>${esc(`${s.name}: ${x} → ${compact(y)}`)}</title></circle>`,
      );
    }
    const ly = m.top + 10 + i * 16;
    parts.push(
      `<rect x="${m.left + pw + 10}" y="${ly - 8}" width="10" height="10" fill="${s.color}"/>`,
      `<text x="${m.left + pw + 24}" y="${ly + 1}" class="v">${esc(s.name)}</text>`,
    );
  });
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">${parts.join('')}</svg>`;
}

function compact(value: number): string {
  const abs = Math.abs(value);
  if (abs >= 1e6) return `${(value / 1e6).toFixed(1)}M`;
  if (abs >= 1e3) return `${(value / 1e3).toFixed(1)}k`;
  if (abs >= 10) return value.toFixed(0);
  if (abs >= 1) return value.toFixed(1);
  return value.toFixed(2);
}
