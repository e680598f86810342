//! Procedural integer arithmetic with a difficulty knob.

use super::{EnvId, Task, TaskAnswer};
use crate::prf::{PrfStream, labels};

/// Largest supported difficulty (larger values are clamped).
pub const MAX_DIFFICULTY: u32 = 10;

/// Arithmetic expressions over non-negative integers, evaluated with the usual
/// precedence (`*` before `+`/`-`, left to right), in `i128` (cannot overflow
/// within [`MAX_DIFFICULTY`]).
///
/// Difficulty `d` (clamped to `0..=10`):
/// - terms: `min(2 + d/2, 6)` (2 to 6),
/// - digits per operand: `1 + (d+1)/2` (1 to 6), operands uniform in `[0, 10^digits)`,
/// - operators: `+` only at `d = 0`; `+`/`-` at `d = 1`; `+`/`-`/`*` from `d = 2`.
///
/// The task's random stream is `PrfStream(ENV, ["arith", d LE32, seed LE64])`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArithEnv {
    difficulty: u32,
}

impl ArithEnv {
    /// An arithmetic environment of difficulty `difficulty` (clamped).
    pub fn new(difficulty: u32) -> Self {
        Self { difficulty: difficulty.min(MAX_DIFFICULTY) }
    }

    /// The (clamped) difficulty.
    pub fn difficulty(&self) -> u32 {
        self.difficulty
    }

    /// The task for `seed`.
    pub fn task(&self, seed: u64) -> Task {
        let d = self.difficulty;
        let mut st = PrfStream::new(labels::ENV, &[b"arith", &d.to_le_bytes(), &seed.to_le_bytes()]);
        let terms = (2 + d / 2).min(6);
        let digits = 1 + d.div_ceil(2);
        let ops: &[char] = match d {
            0 => &['+'],
            1 => &['+', '-'],
            _ => &['+', '-', '*'],
        };
        let bound = 10u64.pow(digits);
        let operands: Vec<u64> = (0..terms).map(|_| st.below(bound)).collect();
        let operators: Vec<char> = (1..terms).map(|_| ops[st.below(ops.len() as u64) as usize]).collect();

        let mut expr = operands[0].to_string();
        for (op, x) in operators.iter().zip(&operands[1..]) {
            expr.push_str(&format!(" {op} {x}"));
        }
        let value = evaluate(&operands, &operators);
        Task {
            env: EnvId::Arith,
            id: seed,
            prompt: format!("Compute {expr}."),
            answer: TaskAnswer::Number(value.to_string()),
        }
    }
}

/// Evaluates `x0 op0 x1 op1 ...` with `*` binding tighter than `+`/`-`.
fn evaluate(operands: &[u64], operators: &[char]) -> i128 {
    let mut total: i128 = 0;
    let mut sign: i128 = 1;
    let mut product = i128::from(operands[0]);
    for (op, &x) in operators.iter().zip(&operands[1..]) {
        let x = i128::from(x);
        match op {
            '*' => product *= x,
            _ => {
                total += sign * product;
                sign = if *op == '-' { -1 } else { 1 };
                product = x;
            }
        }
    }
    total + sign * product
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence() {
        assert_eq!(evaluate(&[2, 3, 4], &['+', '*']), 14);
        assert_eq!(evaluate(&[2, 3, 4], &['*', '-']), 2);
        assert_eq!(evaluate(&[10, 3, 4, 2], &['-', '*', '+']), 0);
        assert_eq!(evaluate(&[5], &[]), 5);
        let big = [999_999u64; 6];
        assert_eq!(evaluate(&big, &['*'; 5]), 999_999i128.pow(6));
    }

    #[test]
    fn knob_and_determinism() {
        let t0 = ArithEnv::new(0).task(1);
        assert_eq!(t0, ArithEnv::new(0).task(1));
        assert!(!t0.prompt.contains('-') && !t0.prompt.contains('*'));
        assert_eq!(t0.prompt.matches(' ').count(), 3, "{}", t0.prompt); // "Compute a + b."
        let hard = ArithEnv::new(99);
        assert_eq!(hard.difficulty(), MAX_DIFFICULTY);
        let t = hard.task(7);
        assert_eq!(t.prompt.split(' ').count(), 1 + 6 * 2 - 1, "{}", t.prompt);
        assert_ne!(ArithEnv::new(3).task(1), ArithEnv::new(3).task(2));
        assert_ne!(ArithEnv::new(3).task(1).prompt, ArithEnv::new(4).task(1).prompt);
        // The answer matches an independent evaluation of the printed expression.
        for seed in 0..50 {
            let t = ArithEnv::new(6).task(seed);
            let expr = t.prompt.trim_start_matches("Compute ").trim_end_matches('.');
            let toks: Vec<&str> = expr.split(' ').collect();
            let xs: Vec<u64> = toks.iter().step_by(2).map(|s| s.parse().unwrap()).collect();
            let ops: Vec<char> = toks.iter().skip(1).step_by(2).map(|s| s.chars().next().unwrap()).collect();
            assert_eq!(t.answer, TaskAnswer::Number(evaluate(&xs, &ops).to_string()));
        }
    }
}
