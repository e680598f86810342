//! Procedural 3-SAT, generated like grail's SAT environment (grail.md §5.3),
//! with our own PRF stream instead of Python's Mersenne Twister.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::{EnvId, RewardRule, Task, TaskAnswer};
use crate::prf::{PrfStream, labels};

/// A 3-SAT instance: variables `x1..=xn`; a literal `+v` is `xv`, `-v` is `NOT xv`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SatProblem {
    /// Number of variables `n`.
    pub num_vars: u32,
    /// Clauses of three literals over distinct variables.
    pub clauses: Vec<[i32; 3]>,
}

impl SatProblem {
    /// Whether `assignment` (`assignment[v-1]` is `xv`) satisfies every clause.
    /// A wrong-length assignment never does.
    pub fn satisfied_by(&self, assignment: &[bool]) -> bool {
        assignment.len() == self.num_vars as usize
            && self.clauses.iter().all(|c| {
                c.iter().any(|&lit| {
                    let v = lit.unsigned_abs() as usize;
                    v >= 1 && assignment.get(v - 1).is_some_and(|&x| x == (lit > 0))
                })
            })
    }

    /// The assignment in a completion: the rest of the line after the last
    /// `Answer:` (case-insensitive) if that holds exactly `n` values, else the
    /// last line holding only `0`/`1` values (separated by spaces or commas)
    /// with exactly `n` values. Values are `0`/`1` separated by whitespace or
    /// commas (brackets ignored).
    pub fn parse_assignment(&self, completion: &str) -> Option<Vec<bool>> {
        let n = self.num_vars as usize;
        let lower = completion.to_ascii_lowercase();
        if let Some(p) = lower.rfind("answer:") {
            let line = completion[p + "answer:".len()..].lines().next().unwrap_or("");
            if let Some(a) = parse_bits(line).filter(|a| a.len() == n) {
                return Some(a);
            }
        }
        completion.lines().rev().find_map(|l| parse_bits(l).filter(|a| a.len() == n))
    }

    /// The assignment of a well-formed final answer line
    /// ([`super::final_answer_line`]): `Answer:` then exactly `n` values `0`/`1`
    /// separated by spaces, nothing else. What the strict and format rules read.
    pub fn parse_strict_assignment(&self, completion: &str) -> Option<Vec<bool>> {
        let value = super::final_answer_line(completion)?;
        let bits: Option<Vec<bool>> = value
            .split_whitespace()
            .map(|s| match s {
                "0" => Some(false),
                "1" => Some(true),
                _ => None,
            })
            .collect();
        bits.filter(|b| b.len() == self.num_vars as usize)
    }
}

/// `0`/`1` values separated by whitespace or commas, optionally inside
/// `[...]`; `None` if anything else appears or there are no values.
fn parse_bits(line: &str) -> Option<Vec<bool>> {
    let line = line.trim().trim_start_matches('[').trim_end_matches(['.', ']']);
    let bits: Option<Vec<bool>> = line
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|s| !s.is_empty())
        .map(|s| match s {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        })
        .collect();
    bits.filter(|b| !b.is_empty())
}

/// The SAT environment. For seed `s`: difficulty `d = 0.3 + (s mod 100)/250`;
/// `n` uniform in `[4 + ⌊5.5d⌋, 4 + ⌊11d⌋]`; `m` uniform in
/// `[5 + ⌊7.5d⌋, 5 + ⌊15d⌋]`; each clause draws 3 distinct variables
/// (partial Fisher–Yates over `1..=n`) and negates each with probability ½.
/// Random stream: `PrfStream(ENV, ["sat", s LE64])`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SatEnv {
    reward: RewardRule,
}

impl SatEnv {
    /// This environment scoring with `rule`.
    pub fn with_reward(self, rule: RewardRule) -> Self {
        Self { reward: rule }
    }

    /// The reward rule ([`RewardRule::Strict`] unless set).
    pub fn reward_rule(&self) -> RewardRule {
        self.reward
    }

    /// The instance for `seed`.
    pub fn problem(&self, seed: u64) -> SatProblem {
        let mut st = PrfStream::new(labels::ENV, &[b"sat", &seed.to_le_bytes()]);
        let d = 0.3 + (seed % 100) as f64 / 250.0;
        let n = st.range_inclusive(4 + (11.0 * d * 0.5) as u64, 4 + (11.0 * d) as u64) as u32;
        let m = st.range_inclusive(5 + (15.0 * d * 0.5) as u64, 5 + (15.0 * d) as u64);
        let clauses = (0..m)
            .map(|_| {
                let mut vars: Vec<i32> = (1..=n as i32).collect();
                let mut clause = [0i32; 3];
                for (i, lit) in clause.iter_mut().enumerate() {
                    let j = i + st.below((vars.len() - i) as u64) as usize;
                    vars.swap(i, j);
                    *lit = if st.coin() { -vars[i] } else { vars[i] };
                }
                clause
            })
            .collect();
        SatProblem { num_vars: n, clauses }
    }

    /// The task for `seed`.
    pub fn task(&self, seed: u64) -> Task {
        let p = self.problem(seed);
        let mut prompt = format!("SAT problem.\nVariables: x1 to x{}\nClauses:\n", p.num_vars);
        for c in &p.clauses {
            let lits: Vec<String> =
                c.iter().map(|&l| if l < 0 { format!("NOT x{}", -l) } else { format!("x{l}") }).collect();
            let _ = writeln!(prompt, "  ({})", lits.join(" OR "));
        }
        let _ = write!(
            prompt,
            "Give a value 0 or 1 to each of x1..x{} so that every clause is true, \
             as a final line like \"Answer: {}\".",
            p.num_vars,
            vec!["0"; p.num_vars as usize].join(" ")
        );
        Task { env: EnvId::Sat, id: seed, prompt, answer: TaskAnswer::Sat(p) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute_force(p: &SatProblem) -> Option<Vec<bool>> {
        let n = p.num_vars as usize;
        (0u32..1 << n).map(|m| (0..n).map(|i| m >> i & 1 == 1).collect::<Vec<_>>()).find(|a| p.satisfied_by(a))
    }

    #[test]
    fn generator_shape() {
        for seed in 0..200u64 {
            let p = SatEnv::default().problem(seed);
            assert_eq!(p, SatEnv::default().problem(seed));
            assert!((4..=15).contains(&p.num_vars), "{}", p.num_vars);
            assert!((5..=20).contains(&p.clauses.len()));
            for c in &p.clauses {
                let mut v: Vec<u32> = c.iter().map(|l| l.unsigned_abs()).collect();
                assert!(v.iter().all(|&x| x >= 1 && x <= p.num_vars));
                v.sort();
                v.dedup();
                assert_eq!(v.len(), 3);
            }
        }
        let negs: usize =
            (0..50).flat_map(|s| SatEnv::default().problem(s).clauses).flatten().filter(|&l| l < 0).count();
        let all: usize = (0..50).map(|s| SatEnv::default().problem(s).clauses.len() * 3).sum();
        assert!(negs * 10 > all * 4 && negs * 10 < all * 6);
    }

    #[test]
    fn reward_for_satisfying_assignment() {
        let mut solved = 0;
        for seed in 0..40u64 {
            let t = SatEnv::default().task(seed);
            let TaskAnswer::Sat(p) = &t.answer else { unreachable!() };
            assert!(t.prompt.contains(&format!("x1 to x{}", p.num_vars)));
            if let Some(a) = brute_force(p) {
                solved += 1;
                let line: Vec<&str> = a.iter().map(|&b| if b { "1" } else { "0" }).collect();
                let text = format!("Let me think.\nAnswer: {}", line.join(" "));
                assert_eq!(t.answer.reward(&text), 1.0);
                let bare = format!("I pick\n[{}]\n", line.join(", "));
                assert_eq!(t.answer.reward(&bare), 1.0);
                let flipped: Vec<bool> = a.iter().map(|b| !b).collect();
                let short = format!("Answer: {}", line[1..].join(" "));
                assert_eq!(t.answer.reward(&short), 0.0);
                if !p.satisfied_by(&flipped) {
                    let fl: Vec<&str> = flipped.iter().map(|&b| if b { "1" } else { "0" }).collect();
                    assert_eq!(t.answer.reward(&format!("Answer: {}", fl.join(" "))), 0.0);
                }
            }
        }
        assert!(solved > 30, "most generated instances are satisfiable: {solved}");
        let p = SatProblem { num_vars: 3, clauses: vec![[1, -2, 3]] };
        assert!(p.satisfied_by(&[false, false, false]));
        assert!(!p.satisfied_by(&[false, true, false]));
        assert!(!p.satisfied_by(&[true, true]));
        assert_eq!(p.parse_assignment("Answer: 1 0 x"), None);
        assert_eq!(p.parse_assignment("Answer: 1 0 1."), Some(vec![true, false, true]));
    }
}
