//! Lenient extraction of a final numeric answer from model output.

/// Markers after which the final answer is expected, matched
/// case-insensitively; the last marker followed by a number wins.
const MARKERS: [&str; 3] = ["answer:", "####", "answer is"];

/// Canonical decimal form of a number written like `-1,234.50`, `$18`,
/// `+3`, `−5` or `18.`: optional sign, no `$`/commas/leading zeros, no
/// trailing fractional zeros, `-0` → `0`. `None` if `s` is not such a number.
pub fn normalize_number(s: &str) -> Option<String> {
    let s = s.trim();
    let mut rest = s.strip_prefix('$').unwrap_or(s);
    let mut neg = false;
    if let Some(r) = rest.strip_prefix('-').or_else(|| rest.strip_prefix('\u{2212}')) {
        neg = true;
        rest = r;
    } else if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    }
    let rest = rest.strip_prefix('$').unwrap_or(rest);
    let rest = rest.strip_suffix('.').unwrap_or(rest);
    let (int, frac) = match rest.split_once('.') {
        Some((i, f)) => (i, f),
        None => (rest, ""),
    };
    let int: String = int.chars().filter(|&c| c != ',').collect();
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    Some(canonical(neg, &int, frac))
}

fn canonical(neg: bool, int: &str, frac: &str) -> String {
    let int = int.trim_start_matches('0');
    let frac = frac.trim_end_matches('0');
    let mut out = String::with_capacity(int.len() + frac.len() + 3);
    if neg && !(int.is_empty() && frac.is_empty()) {
        out.push('-');
    }
    out.push_str(if int.is_empty() { "0" } else { int });
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    out
}

/// Every number in `text`, in order, as `(byte offset of its first digit,
/// canonical form)`. A `-` (or `−`), optionally followed by `$`, directly
/// before the digits makes the number negative unless it follows a letter,
/// digit or `)` (so `16-3` is `16`, `3`). Commas followed by a digit are
/// thousands separators; a `.` followed by a digit starts the fraction.
fn numbers(text: &str) -> Vec<(usize, String)> {
    let c: Vec<(usize, char)> = text.char_indices().collect();
    let mut out = Vec::new();
    let digit_at = |k: usize| c.get(k).is_some_and(|&(_, ch)| ch.is_ascii_digit());
    let mut i = 0;
    while i < c.len() {
        if !c[i].1.is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        let mut j = start;
        if j > 0 && c[j - 1].1 == '$' {
            j -= 1;
        }
        let neg = j > 0
            && matches!(c[j - 1].1, '-' | '\u{2212}')
            && (j == 1 || !(c[j - 2].1.is_alphanumeric() || c[j - 2].1 == ')'));
        let mut int = String::new();
        while i < c.len() {
            let ch = c[i].1;
            if ch.is_ascii_digit() {
                int.push(ch);
                i += 1;
            } else if ch == ',' && digit_at(i + 1) {
                i += 1;
            } else {
                break;
            }
        }
        let mut frac = String::new();
        if i < c.len() && c[i].1 == '.' && digit_at(i + 1) {
            i += 1;
            while digit_at(i) {
                frac.push(c[i].1);
                i += 1;
            }
        }
        out.push((c[start].0, canonical(neg, &int, &frac)));
    }
    out
}

/// The final numeric answer of a completion, canonicalized: the first number
/// after the last marker (`Answer:`, `####`, `answer is`; case-insensitive)
/// that is followed by one, else the last number in the text.
pub fn extract_number(text: &str) -> Option<String> {
    let nums = numbers(text);
    let lower = text.to_ascii_lowercase();
    let mut marks: Vec<usize> =
        MARKERS.iter().flat_map(|m| lower.match_indices(m).map(move |(p, _)| p + m.len())).collect();
    marks.sort_unstable();
    for &m in marks.iter().rev() {
        if let Some((_, n)) = nums.iter().find(|(p, _)| *p >= m) {
            return Some(n.clone());
        }
    }
    nums.last().map(|(_, n)| n.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes() {
        for (a, b) in [
            ("18", "18"),
            ("$18", "18"),
            ("-$1,234.50", "-1234.5"),
            ("$-3", "-3"),
            ("+007", "7"),
            ("\u{2212}5", "-5"),
            ("18.", "18"),
            ("0.000", "0"),
            ("-0", "0"),
            (".5", "0.5"),
        ] {
            assert_eq!(normalize_number(a).as_deref(), Some(b), "{a}");
        }
        let bad = ["", "abc", "1e5", "--1", "1.2.3", "$", "-"];
        for a in bad {
            assert_eq!(normalize_number(a), None, "{a}");
        }
    }

    #[test]
    fn extracts() {
        let cases = [
            ("Janet sells 16 - 3 - 4 = 9 eggs.\nShe makes 9 * 2 = $18.\n#### 18", Some("18")),
            ("The answer is $1,080.", Some("1080")),
            ("Answer: -42\nThanks for asking, 7 more.", Some("-42")),
            ("answer: 3.50 dollars", Some("3.5")),
            ("16-3 equals 13", Some("13")),
            ("The value is -7", Some("-7")),
            ("x-7", Some("7")),
            ("So the answer is: 12, not 1,000", Some("12")),
            ("Answer: none. I think 5", Some("5")),
            ("no digits here", None),
            ("Answer: 1,2 and 3", Some("12")),
            ("ANSWER IS 4", Some("4")),
            ("Answer: 5.\n", Some("5")),
        ];
        for (text, want) in cases {
            assert_eq!(extract_number(text).as_deref(), want, "{text:?}");
        }
    }
}
