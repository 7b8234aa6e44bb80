// The inspector's word diff of two summary versions: what left a summary and what came in.

// Above this many cells the word diff's LCS table (4 bytes each) is not built: the two texts
// are shown as replaced whole instead.
const DIFF_MAX_CELLS = 4_000_000;

// --- the word diff ------------------------------------------------------------------------

// A word is a run of letters and digits (inner "4.5", "QX-5521", "I'm" kept whole); any other
// character is a token of its own, so that "grams." and "grams.;" differ by the ";" only. A CJK
// character (or full-width punctuation) is a token of its own too: such text has no spaces.
const CJK = "\\p{Script=Han}\\p{Script=Hiragana}\\p{Script=Katakana}\\p{Script=Hangul}\\u3000-\\u303f\\uff00-\\uffef";
const LETTER = `(?:(?![${CJK}])[\\p{L}\\p{N}\\p{M}_])`;
const TOKEN = new RegExp(`(\\s+)|([${CJK}])|(${LETTER}+(?:['’.,:/-]${LETTER}+)*)|(.)`, "gu");

/** Tokens of a text, each `{word, text}`: `text` is the word and the whitespace after it, so
 * that the diff compares words and shows the text as it was. */
function tokenize(text) {
  const tokens = [];
  let lead = "";
  for (const m of text.matchAll(TOKEN)) {
    if (m[1] !== undefined) {
      if (tokens.length) tokens[tokens.length - 1].text += m[1];
      else lead += m[1];
    } else {
      tokens.push({ word: m[0], text: m[0] });
    }
  }
  if (lead && tokens.length) tokens[0].text = lead + tokens[0].text;
  return tokens;
}

/** The diff of two texts as runs `{op: "same" | "removed" | "added", text}`, by the longest
 * common subsequence of their tokens. */
export function wordDiff(before, after) {
  const a = tokenize(before);
  const b = tokenize(after);
  let start = 0;
  while (start < a.length && start < b.length && a[start].word === b[start].word) start += 1;
  let endA = a.length;
  let endB = b.length;
  while (endA > start && endB > start && a[endA - 1].word === b[endB - 1].word) {
    endA -= 1;
    endB -= 1;
  }
  const ops = [];
  for (let i = 0; i < start; i += 1) ops.push(["same", b[i].text]);
  const midA = a.slice(start, endA);
  const midB = b.slice(start, endB);
  const n = midA.length;
  const m = midB.length;
  if (n * m > DIFF_MAX_CELLS) {
    for (const t of midA) ops.push(["removed", t.text]);
    for (const t of midB) ops.push(["added", t.text]);
  } else {
    // lcs[i][j]: the LCS of midA[i:] and midB[j:], row-major in one array.
    const width = m + 1;
    const lcs = new Uint32Array((n + 1) * width);
    for (let i = n - 1; i >= 0; i -= 1) {
      for (let j = m - 1; j >= 0; j -= 1) {
        lcs[i * width + j] =
          midA[i].word === midB[j].word
            ? lcs[(i + 1) * width + j + 1] + 1
            : Math.max(lcs[(i + 1) * width + j], lcs[i * width + j + 1]);
      }
    }
    let i = 0;
    let j = 0;
    while (i < n && j < m) {
      if (midA[i].word === midB[j].word) {
        ops.push(["same", midB[j].text]);
        i += 1;
        j += 1;
      } else if (lcs[(i + 1) * width + j] >= lcs[i * width + j + 1]) {
        ops.push(["removed", midA[i].text]);
        i += 1;
      } else {
        ops.push(["added", midB[j].text]);
        j += 1;
      }
    }
    for (; i < n; i += 1) ops.push(["removed", midA[i].text]);
    for (; j < m; j += 1) ops.push(["added", midB[j].text]);
  }
  for (let i = endB; i < b.length; i += 1) ops.push(["same", b[i].text]);
  const runs = [];
  for (const [op, text] of ops) {
    const last = runs[runs.length - 1];
    if (last && last.op === op) last.text += text;
    else runs.push({ op, text });
  }
  return runs;
}
