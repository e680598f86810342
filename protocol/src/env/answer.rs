//! Reading a final answer out of model output: the lenient extraction
//! ([`extract_number`], a metric), the strict final line ([`final_answer_line`],
//! what training pays for by default) and the rules that choose between them
//! ([`RewardRule`]).

use std::fmt;
use std::str::FromStr;

/// How a completion's answer is read when its reward is computed. Part of a
/// window's contract (`WindowInfo::reward`): miner, validator, the
/// coordinator's re-check and the trainer all score with the window's rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RewardRule {
    /// The default: 1 only when the completion's last non-empty line is a
    /// well-formed `Answer: N` ([`final_answer_line`]) and `N` is right (SAT:
    /// `Answer:` then exactly one 0/1 per variable, satisfying every clause).
    #[default]
    Strict,
    /// The number after the last `Answer:`-style marker, else the last number
    /// anywhere ([`extract_number`]); SAT: the lenient assignment parse. Pays
    /// for completions that ignore the requested format: a metric, and the
    /// rule of networks and offline records from before protocol version 6.
    Lenient,
    /// A control arm: 1 for a well-formed final `Answer:` line whatever its
    /// value (correctness ignored), else 0.
    Format,
}

impl RewardRule {
    /// Every rule, strict first.
    pub const ALL: [RewardRule; 3] = [RewardRule::Strict, RewardRule::Lenient, RewardRule::Format];

    /// The lowercase name (`"strict"`, `"lenient"`, `"format"`).
    pub fn as_str(&self) -> &'static str {
        match self {
            RewardRule::Strict => "strict",
            RewardRule::Lenient => "lenient",
            RewardRule::Format => "format",
        }
    }

    /// The rule of records written before the rule was recorded (lenient).
    pub fn legacy() -> Self {
        RewardRule::Lenient
    }
}

impl fmt::Display for RewardRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown reward rule name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reward rule {0:?} (expected strict, lenient or format)")]
pub struct UnknownRewardRule(pub String);

impl FromStr for RewardRule {
    type Err = UnknownRewardRule;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RewardRule::ALL.into_iter().find(|r| r.as_str() == s.trim()).ok_or_else(|| UnknownRewardRule(s.to_owned()))
    }
}

/// The value of a well-formed final answer line: the completion's last
/// non-empty line, trimmed, is `Answer:` (this exact spelling) followed by the
/// value (trimmed, non-empty). `None` when the last line is anything else.
pub fn final_answer_line(text: &str) -> Option<&str> {
    let last = text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    let value = last.strip_prefix("Answer:")?.trim();
    (!value.is_empty()).then_some(value)
}

/// The strict numeric answer: [`final_answer_line`]'s value when it is one
/// number ([`normalize_number`]), canonicalized.
pub fn strict_number(text: &str) -> Option<String> {
    final_answer_line(text).and_then(normalize_number)
}

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
    fn reward_rules_have_names() {
        for r in RewardRule::ALL {
            assert_eq!(r.as_str().parse::<RewardRule>().unwrap(), r);
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{r}\""));
        }
        assert_eq!(RewardRule::default(), RewardRule::Strict);
        assert!("loose".parse::<RewardRule>().is_err());
    }

    #[test]
    fn the_final_answer_line_is_the_last_non_empty_line() {
        let cases = [
            ("12 + 7 = 19\nAnswer: 19", Some("19")),
            ("Answer: -13\n\n  ", Some("-13")),
            ("  Answer:   42  ", Some("42")),
            ("Answer: 19\nThanks!", None),
            ("so... Answer: 19", None),
            ("answer: 19", None),
            ("Answer:", None),
            ("56 + 65 = 121", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(final_answer_line(text), want, "{text:?}");
        }
        assert_eq!(strict_number("Answer: $1,234.50").as_deref(), Some("1234.5"));
        assert_eq!(strict_number("Answer: 19 apples"), None, "one number and nothing else");
        assert_eq!(strict_number("Answer: 19."), Some("19".into()));
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
