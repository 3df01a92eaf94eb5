/** Tiny SVG chart builders for the self-contained HTML report (no scripts, no external assets). */

export function esc(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

/**
 * A generous estimate of how wide `text` renders in a sans-serif font of `fontSize` px
 * (there is no layout engine here): wide enough that text placed by it is never cut off.
 */
export function textWidth(text: string, fontSize: number): number {
  let em = 0;
  for (const ch of text) {
    if (/[ilj.,:;'|!()[\]{}/\\ ]/.test(ch)) em += 0.36;
    else if (/[mwMW%@×→÷—]/.test(ch)) em += 0.95;
    else if (/[A-Z]/.test(ch)) em += 0.72;
    else em += 0.6;
  }
  return Math.ceil(em * fontSize);
}

/** Font sizes of the chart text classes (the page's CSS: text.v 11px, text.l 12px). */
const VALUE_FONT = 11;
const LABEL_FONT = 12;

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
  // The plot keeps its nominal width; the label and text room grow to fit what they hold,
  // so no label is cut off (the chart is then wider than `width`).
  const nominalLabel = 150;
  const nominalText = options.textWidth ?? 230;
  const plot = (options.width ?? 820) - nominalLabel - nominalText;
  const labelWidth = Math.max(nominalLabel, ...groups.map((g) => textWidth(g.label, LABEL_FONT) + 12));
  const barText = Math.max(
    nominalText,
    ...groups.flatMap((g) => g.bars.map((b) => textWidth(`${b.name}: ${b.text}`, VALUE_FONT) + 10)),
    ...(options.references ?? []).map((r) => textWidth(r.label, VALUE_FONT) + 10),
  );
  const width = labelWidth + plot + barText;
  const barHeight = 14;
  const gap = 10;
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
  /** A stroke-dasharray, to tell apart series of one color (e.g. one mode at several concurrencies). */
  readonly dash?: string;
  readonly points: ReadonlyArray<readonly [number, number]>;
}

/** A line chart with log-scaled axes where asked (every value must then be > 0). */
export function lineChart(
  series: readonly Series[],
  options: { xLabel: string; yLabel: string; xLog?: boolean; yLog?: boolean; yMax?: number; width?: number },
): string {
  const all = series.flatMap((s) => s.points);
  if (all.length === 0) return '';
  // The legend sits right of the plot: as wide as its longest name, one line per series.
  const legend = Math.max(120, ...series.map((s) => textWidth(s.name, VALUE_FONT) + 34));
  const m = { left: 64, right: legend, top: 12, bottom: 40 };
  const width = Math.max(options.width ?? 580, m.left + 316 + legend);
  const height = Math.max(260, m.top + m.bottom + series.length * 16 + 10);
  const pw = width - m.left - m.right;
  const ph = height - m.top - m.bottom;
  const tx = (v: number) => (options.xLog ? Math.log10(v) : v);
  const ty = (v: number) => (options.yLog ? Math.log10(Math.max(v, 1e-3)) : v);
  const xs = all.map(([x]) => tx(x));
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  if (x1 === x0) [x0, x1] = [x0 - 1, x1 + 1];
  const yValues = all.map(([, y]) => (options.yLog ? Math.max(y, 1e-3) : y));
  const yTicks = options.yLog
    ? logTicks(Math.min(...yValues), Math.max(...yValues))
    : linearTicks(0, Math.max(options.yMax ?? 0, ...yValues));
  const y0 = ty(yTicks[0]!);
  const y1 = ty(yTicks[yTicks.length - 1]!);
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
  const labels = tickLabels(yTicks);
  for (const [i, value] of yTicks.entries()) {
    const y = py(value).toFixed(1);
    parts.push(
      `<line x1="${m.left}" x2="${m.left + pw}" y1="${y}" y2="${y}" stroke="#eee"/>`,
      `<text x="${m.left - 4}" y="${Number(y) + 4}" text-anchor="end" class="v">${esc(labels[i]!)}</text>`,
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
    const dash = s.dash ? ` stroke-dasharray="${s.dash}"` : '';
    parts.push(`<path d="${d}" fill="none" stroke="${s.color}" stroke-width="2"${dash}/>`);
    for (const [x, y] of pts) {
      parts.push(
        `<circle cx="${px(x).toFixed(1)}" cy="${py(y).toFixed(1)}" r="3" fill="${s.color}"><title>${esc(`${s.name}: ${x} → ${compact(y)}`)}</title></circle>`,
      );
    }
    const ly = m.top + 10 + i * 16;
    parts.push(
      `<line x1="${m.left + pw + 6}" x2="${m.left + pw + 20}" y1="${ly - 3}" y2="${ly - 3}" stroke="${s.color}" stroke-width="3"${dash}/>`,
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

/** 1, 2, 2.5 or 5 times a power of ten: the smallest such step at least `raw`. */
function niceStep(raw: number): number {
  const p = 10 ** Math.floor(Math.log10(raw));
  const f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
}

/** Removes floating-point noise (0.30000000000000004 → 0.3). */
const clean = (v: number) => Number(v.toPrecision(12));

/**
 * Ticks for a linear axis covering [min, max]: about five, a nice step apart (1, 2, 2.5
 * or 5 times a power of ten), the ends widened to whole steps. Ticks are distinct however
 * narrow the range.
 */
export function linearTicks(min: number, max: number, target = 5): number[] {
  if (!(max > min)) [min, max] = max === 0 ? [0, 1] : [min - Math.abs(min) * 0.1, max + Math.abs(max) * 0.1];
  const step = niceStep((max - min) / (target - 1));
  const lo = Math.floor(clean(min / step)) * step;
  const hi = Math.ceil(clean(max / step)) * step;
  const ticks: number[] = [];
  for (let i = 0; lo + i * step <= hi + step / 2; i++) ticks.push(clean(lo + i * step));
  return ticks;
}

/**
 * Ticks for a log axis covering [min, max] (both > 0): 1-2-5 steps over a range of a
 * decade or more (decades only over a wide range), else linear ticks within the range.
 */
export function logTicks(min: number, max: number): number[] {
  if (max / min < 10) {
    const ticks = linearTicks(min, max).filter((t) => t > 0);
    return ticks.length >= 2 ? ticks : [min, max];
  }
  const decades = Math.log10(max / min);
  const mantissas = decades > 4 ? [1] : [1, 2, 5];
  const sequence: number[] = [];
  for (let e = Math.floor(Math.log10(min)) - 1; e <= Math.ceil(Math.log10(max)) + 1; e++) {
    for (const f of mantissas) sequence.push(clean(f * 10 ** e));
  }
  const lo = Math.max(...sequence.filter((t) => t <= min));
  const hi = Math.min(...sequence.filter((t) => t >= max));
  return sequence.filter((t) => t >= lo && t <= hi);
}

/**
 * Labels for ticks: each in k or M when that large, with as many decimals as it takes to
 * show it exactly (ticks are nice numbers), so no two distinct ticks read the same.
 */
export function tickLabels(ticks: readonly number[]): string[] {
  return ticks.map((t) => {
    const abs = Math.abs(t);
    const [unit, suffix] = abs >= 1e6 ? [1e6, 'M'] : abs >= 1e3 ? [1e3, 'k'] : [1, ''];
    const v = t / unit;
    let decimals = 0;
    while (decimals < 6 && Math.abs(Math.round(v * 10 ** decimals) - v * 10 ** decimals) > 1e-6) decimals++;
    return `${v.toFixed(decimals)}${suffix}`;
  });
}
