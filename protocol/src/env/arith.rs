//! Procedural integer arithmetic with a difficulty knob.

use super::{EnvId, RewardRule, Task, TaskAnswer};
use crate::prf::{PrfStream, labels};

/// Largest level of the coarse scale (larger values that are not
/// [bridge levels](BRIDGE_LEVELS) are clamped to it).
pub const MAX_DIFFICULTY: u32 = 10;

/// First bridge level: the finer steps between coarse difficulties 0 and 1,
/// numbered after the coarse scale so that every coarse task stays the same.
pub const BRIDGE_FIRST: u32 = 100;

/// The bridge levels, with what each asks. `100`–`104` have non-negative
/// results:
/// - `100`: `a + b`, `a` two digits (`10..=99`), `b` one digit (`0..=9`);
/// - `101`: `a + b`, both two digits, no carry (the ones and the tens each
///   sum below 10);
/// - `102`: `a - b`, both one digit, `a >= b`;
/// - `103`: `a + b + c`, one digit each;
/// - `104`: `a + b`, both two digits (carries allowed).
///
/// `105`–`107` mix addition and subtraction (each half the time; results may
/// be negative) and digit counts, and form one training level with two
/// evaluation columns that no `105` task ever draws from:
/// - `105`: `a ± b`, `a` and `b` in `0..=89` (one or two digits): the
///   training level;
/// - `106`: `a ± b` over `0..=99` with at least one operand in the band
///   `90..=99` (an operand band `105` never trains on);
/// - `107`: `a ± b` with one three-digit (`100..=999`) and one two-digit
///   (`10..=99`) operand, either first (out of distribution for `105`).
///
/// `108` is a second training level for the same columns: `a ± b` over
/// `0..=89` like `105`, but subtraction three times in four (addition once).
/// Its problems are `105`'s (the split hashes the problem text, not the
/// level), so it never draws a problem of `105`'s test split, and the
/// columns a `108` network is measured on are `105`–`107`'s. It exists
/// because a `105` network's gradient was mostly addition: of the groups a
/// step trained on, 60–62 % were sums, which the policy had mostly learned,
/// while most subtraction groups were all wrong (`docs/training.md`).
///
/// From `105` on, the train/test split sees `a + b` and `b + a` as one
/// problem ([`ArithEnv::split_key`]).
///
/// Base SmolLM2-135M-Instruct, greedy: see `docs/training.md`.
pub const BRIDGE_LEVELS: std::ops::RangeInclusive<u32> = BRIDGE_FIRST..=BRIDGE_FIRST + 8;

/// The worked-example levels: `115`–`118` ask exactly the problems of
/// `105`–`108` (the same task for every seed, the same train/test split)
/// with a prompt that shows the answer format as well as asking for it:
/// three worked examples ([`WORKED_EXAMPLES`]) as earlier chat turns before
/// the question ([`ArithEnv::worked_examples`]). With the system prompt alone
/// SmolLM2-135M-Instruct never ends with an `Answer:` line (greedy: 0 % well
/// formed on `105`; sampled at T = 0.7: 0 of 384 rollouts in the first four
/// windows of three networks, `docs/training.md`), so the strict reward is 0
/// for every rollout and no group has an advantage to learn from.
pub const WORKED_LEVELS: std::ops::RangeInclusive<u32> = BRIDGE_FIRST + 15..=BRIDGE_FIRST + 18;

/// How far a worked-example level is above the level whose problems it asks.
pub const WORKED_OFFSET: u32 = 10;

/// The worked examples of [`WORKED_LEVELS`] (fixed; not tuned on any
/// evaluation column): `(expression, value)`, each rendered as the user turn
/// `Compute {expression}.` and the assistant turn
/// `{expression} = {value}\nAnswer: {value}`.
pub const WORKED_EXAMPLES: [(&str, &str); 3] = [("23 + 58", "81"), ("41 - 67", "-26"), ("7 + 35", "42")];

/// The first level whose split treats `a + b` and `b + a` as one problem.
pub const COMMUTATIVE_SPLIT_FIRST: u32 = BRIDGE_FIRST + 5;

/// The practice level, for `--dev` networks and tests only: tasks shaped like
/// coarse level 0 (`a + b`, one digit each) whose answer is
/// [`TaskAnswer::Practice`]: reward 1 for the right number, otherwise a
/// partial credit that grows as the completion gets shorter
/// ([`super::practice_credit`]). The random tiny model never adds right, so
/// with the plain reward its groups have no variance and teach nothing; this
/// shaping gives it an honest learning signal (miner, validator and trainer
/// compute the same function of the completion), but it pays for brevity,
/// not arithmetic: never use it on a real network.
pub const PRACTICE_LEVEL: u32 = 900;

/// Arithmetic expressions over non-negative integers, evaluated with the usual
/// precedence (`*` before `+`/`-`, left to right), in `i128` (cannot overflow
/// within [`MAX_DIFFICULTY`]).
///
/// Coarse difficulty `d` (`0..=10`; other values outside [`BRIDGE_LEVELS`]
/// are clamped to 10):
/// - terms: `min(2 + d/2, 6)` (2 to 6),
/// - digits per operand: `1 + (d+1)/2` (1 to 6), operands uniform in `[0, 10^digits)`,
/// - operators: `+` only at `d = 0`; `+`/`-` at `d = 1`; `+`/`-`/`*` from `d = 2`.
///
/// Bridge levels ([`BRIDGE_LEVELS`]) sit between coarse 0 (one-digit sums)
/// and coarse 1 (two-digit sums and differences).
///
/// The task's random stream is `PrfStream(ENV, ["arith", d LE32, seed LE64])`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArithEnv {
    difficulty: u32,
    reward: RewardRule,
}

impl ArithEnv {
    /// An arithmetic environment of difficulty `difficulty`: a coarse level
    /// (`0..=10`, larger values clamped to 10), a bridge level
    /// ([`BRIDGE_LEVELS`]) or the [`PRACTICE_LEVEL`] (kept as is).
    pub fn new(difficulty: u32) -> Self {
        let kept =
            BRIDGE_LEVELS.contains(&difficulty) || WORKED_LEVELS.contains(&difficulty) || difficulty == PRACTICE_LEVEL;
        let difficulty = if kept { difficulty } else { difficulty.min(MAX_DIFFICULTY) };
        Self { difficulty, reward: RewardRule::default() }
    }

    /// This environment scoring with `rule`.
    pub fn with_reward(self, rule: RewardRule) -> Self {
        Self { reward: rule, ..self }
    }

    /// The reward rule ([`RewardRule::Strict`] unless set).
    pub fn reward_rule(&self) -> RewardRule {
        self.reward
    }

    /// The text the train/test split hashes for `prompt` (a prompt of this
    /// level): the prompt itself, except from [`COMMUTATIVE_SPLIT_FIRST`] on,
    /// where a two-operand sum is written with its smaller operand first, so
    /// that `a + b` and `b + a` fall on the same side.
    pub fn split_key<'a>(&self, prompt: &'a str) -> std::borrow::Cow<'a, str> {
        if !(COMMUTATIVE_SPLIT_FIRST..=*BRIDGE_LEVELS.end()).contains(&self.problem_level()) {
            return prompt.into();
        }
        let expr = prompt.strip_prefix("Compute ").and_then(|e| e.strip_suffix('.'));
        let parts: Option<Vec<&str>> = expr.map(|e| e.split(' ').collect());
        match parts.as_deref() {
            Some([a, "+", b]) => match (a.parse::<u64>(), b.parse::<u64>()) {
                (Ok(x), Ok(y)) if x > y => format!("Compute {y} + {x}.").into(),
                _ => prompt.into(),
            },
            _ => prompt.into(),
        }
    }

    /// The difficulty (after clamping).
    pub fn difficulty(&self) -> u32 {
        self.difficulty
    }

    /// The level whose problems this one asks: the difficulty, or for a
    /// [worked-example level](WORKED_LEVELS) the level [`WORKED_OFFSET`] below.
    pub fn problem_level(&self) -> u32 {
        if WORKED_LEVELS.contains(&self.difficulty) { self.difficulty - WORKED_OFFSET } else { self.difficulty }
    }

    /// The worked examples its prompt shows before the question, as
    /// `(user, assistant)` turns: [`WORKED_EXAMPLES`] on a
    /// [worked-example level](WORKED_LEVELS), none otherwise.
    pub fn worked_examples(&self) -> Vec<(String, String)> {
        if !WORKED_LEVELS.contains(&self.difficulty) {
            return Vec::new();
        }
        WORKED_EXAMPLES.iter().map(|(q, a)| (format!("Compute {q}."), format!("{q} = {a}\nAnswer: {a}"))).collect()
    }

    /// The task for `seed`.
    pub fn task(&self, seed: u64) -> Task {
        let d = self.problem_level();
        let mut st = PrfStream::new(labels::ENV, &[b"arith", &d.to_le_bytes(), &seed.to_le_bytes()]);
        let (operands, operators) = match d {
            PRACTICE_LEVEL => coarse(0, &mut st),
            d if BRIDGE_LEVELS.contains(&d) => bridge(d, &mut st),
            d => coarse(d, &mut st),
        };

        let mut expr = operands[0].to_string();
        for (op, x) in operators.iter().zip(&operands[1..]) {
            expr.push_str(&format!(" {op} {x}"));
        }
        let value = evaluate(&operands, &operators).to_string();
        Task {
            env: EnvId::Arith,
            id: seed,
            prompt: format!("Compute {expr}."),
            answer: if d == PRACTICE_LEVEL { TaskAnswer::Practice(value) } else { TaskAnswer::Number(value) },
        }
    }
}

/// Operands and operators of coarse level `d` (`0..=10`).
fn coarse(d: u32, st: &mut PrfStream) -> (Vec<u64>, Vec<char>) {
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
    (operands, operators)
}

/// Operands and operators of bridge level `d` ([`BRIDGE_LEVELS`]).
fn bridge(d: u32, st: &mut PrfStream) -> (Vec<u64>, Vec<char>) {
    match d - BRIDGE_FIRST {
        0 => (vec![st.range_inclusive(10, 99), st.below(10)], vec!['+']),
        1 => {
            // Tens: a in 1..=8, b in 1..=9-a; ones: x in 0..=9, y in 0..=9-x.
            let (ta, ua) = (st.range_inclusive(1, 8), st.below(10));
            let (tb, ub) = (st.range_inclusive(1, 9 - ta), st.below(10 - ua));
            (vec![10 * ta + ua, 10 * tb + ub], vec!['+'])
        }
        2 => {
            let (x, y) = (st.below(10), st.below(10));
            (vec![x.max(y), x.min(y)], vec!['-'])
        }
        3 => ((0..3).map(|_| st.below(10)).collect(), vec!['+', '+']),
        4 => (vec![st.range_inclusive(10, 99), st.range_inclusive(10, 99)], vec!['+']),
        5 => {
            let op = plus_or_minus(st);
            (vec![st.below(90), st.below(90)], vec![op])
        }
        6 => {
            let op = plus_or_minus(st);
            let (band, other) = (st.range_inclusive(90, 99), st.below(100));
            (if st.below(2) == 0 { vec![band, other] } else { vec![other, band] }, vec![op])
        }
        7 => {
            let op = plus_or_minus(st);
            let (big, small) = (st.range_inclusive(100, 999), st.range_inclusive(10, 99));
            (if st.below(2) == 0 { vec![big, small] } else { vec![small, big] }, vec![op])
        }
        _ => {
            let op = if st.below(4) == 0 { '+' } else { '-' };
            (vec![st.below(90), st.below(90)], vec![op])
        }
    }
}

/// `+` or `-`, each half the time.
fn plus_or_minus(st: &mut PrfStream) -> char {
    if st.below(2) == 0 { '+' } else { '-' }
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
        assert_eq!(ArithEnv::new(BRIDGE_FIRST - 1).difficulty(), MAX_DIFFICULTY);
        assert_eq!(ArithEnv::new(*BRIDGE_LEVELS.end() + 1).difficulty(), MAX_DIFFICULTY);
        assert_eq!(ArithEnv::new(u32::MAX).task(7), hard.task(7));
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

    /// Parses `Compute a op b ... .` back into operands and operators.
    fn parse(prompt: &str) -> (Vec<u64>, Vec<char>) {
        let expr = prompt.trim_start_matches("Compute ").trim_end_matches('.');
        let toks: Vec<&str> = expr.split(' ').collect();
        let xs = toks.iter().step_by(2).map(|s| s.parse().unwrap()).collect();
        let ops = toks.iter().skip(1).step_by(2).map(|s| s.chars().next().unwrap()).collect();
        (xs, ops)
    }

    #[test]
    fn coarse_levels_are_unchanged() {
        // The refactor into coarse()/bridge() keeps every coarse task: pinned prompts.
        let got: Vec<String> = (0..=MAX_DIFFICULTY).map(|d| ArithEnv::new(d).task(12345).prompt).collect();
        let digest = blake3::hash(got.join("\n").as_bytes());
        assert_eq!(digest.to_hex().as_str(), COARSE_PINNED, "{got:?}");
    }

    const COARSE_PINNED: &str = "bed0fdcced10a4b0db92769e075a37d8a031c8369dd4c43e92f3465363222603";

    #[test]
    fn bridge_levels_before_the_mixed_ones_are_unchanged() {
        // Adding levels 105-107 keeps every task of 100-104, before and
        // after the train/test split's redraws: pinned prompts.
        let got: Vec<String> = (BRIDGE_FIRST..COMMUTATIVE_SPLIT_FIRST)
            .flat_map(|d| {
                let env = super::super::Environment::Arith(ArithEnv::new(d));
                (0..50).flat_map(move |s| [ArithEnv::new(d).task(s).prompt, env.task(s).prompt])
            })
            .collect();
        let digest = blake3::hash(got.join("\n").as_bytes());
        assert_eq!(digest.to_hex().as_str(), BRIDGE_PINNED, "{got:?}");
    }

    const BRIDGE_PINNED: &str = "9145016bfebb9557abbc21888aa29d23997fa5902f967a4c411f387777e6e442";

    #[test]
    fn worked_levels_ask_the_mixed_levels_problems_with_examples() {
        use super::super::Environment;
        for d in WORKED_LEVELS {
            let (worked, plain) = (ArithEnv::new(d), ArithEnv::new(d - WORKED_OFFSET));
            assert_eq!((worked.difficulty(), worked.problem_level()), (d, d - WORKED_OFFSET));
            let (we, pe) = (Environment::Arith(worked), Environment::Arith(plain));
            for seed in 0..300 {
                // The same task for every seed, before and after the split's redraws.
                assert_eq!(worked.task(seed), plain.task(seed));
                assert_eq!(we.task(seed), pe.task(seed));
                let t = we.task(seed);
                assert_eq!(we.split_of(&t), pe.split_of(&t));
                assert_eq!(worked.split_key(&t.prompt), plain.split_key(&t.prompt));
            }
            assert_eq!(we.test_problems(50), pe.test_problems(50));
            assert_eq!(we.distinct_problems(50), pe.distinct_problems(50));
            // The prompt: the plain one with the examples' turns before the question.
            let t = we.task(1);
            let (w, p) = (we.prompt_text(&t), pe.prompt_text(&t));
            assert_ne!(w, p);
            assert!(w.starts_with(p.split("<|im_start|>user").next().unwrap()), "{w}");
            assert!(w.ends_with(&format!("<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n", t.prompt)), "{w}");
            assert_eq!(w.matches("<|im_start|>assistant\n").count(), 1 + WORKED_EXAMPLES.len());
            assert!(plain.worked_examples().is_empty());
        }
        // Every example is right, is a well-formed final Answer line the
        // strict reward pays, and no example is a problem of any column.
        for (q, a) in WORKED_EXAMPLES {
            let (xs, ops) = parse(&format!("Compute {q}."));
            assert_eq!(evaluate(&xs, &ops).to_string(), a);
            let answer = TaskAnswer::Number(a.to_owned());
            assert_eq!(answer.score(RewardRule::Strict, &format!("{q} = {a}\nAnswer: {a}")), 1.0);
        }
        // The levels around them are clamped as before.
        assert_eq!(ArithEnv::new(119).difficulty(), MAX_DIFFICULTY);
        assert_eq!(ArithEnv::new(114).difficulty(), MAX_DIFFICULTY);
    }

    #[test]
    fn practice_level() {
        let env = ArithEnv::new(PRACTICE_LEVEL);
        assert_eq!(env.difficulty(), PRACTICE_LEVEL);
        for seed in 0..100 {
            let t = env.task(seed);
            let (xs, ops) = parse(&t.prompt);
            assert!(ops == ['+'] && xs.iter().all(|&x| x < 10), "{}", t.prompt);
            let TaskAnswer::Practice(want) = &t.answer else { panic!("practice answers: {:?}", t.answer) };
            assert_eq!(*want, (xs[0] + xs[1]).to_string());
            assert_eq!(t.answer.reward(&format!("Answer: {want}")), 1.0);
            // Wrong or no answer: a credit below 1/2 that shrinks with length.
            let short = t.answer.reward("Answer: 19");
            let long = t.answer.reward("I am not sure what the sum is, sorry. Answer: 19");
            assert!(0.0 < long && long < short && short < 0.5, "{long} {short}");
            assert_eq!(t.answer.reward(""), 0.5);
        }
    }

    #[test]
    fn bridge_levels() {
        for d in BRIDGE_LEVELS {
            let env = ArithEnv::new(d);
            assert_eq!(env.difficulty(), d);
            let mut prompts = std::collections::HashSet::new();
            for seed in 0..400 {
                let t = env.task(seed);
                assert_eq!(t, env.task(seed));
                let (xs, ops) = parse(&t.prompt);
                let value = evaluate(&xs, &ops);
                assert_eq!(t.answer, TaskAnswer::Number(value.to_string()));
                assert!(value >= 0 || d >= COMMUTATIVE_SPLIT_FIRST, "{}", t.prompt);
                let pm = ops == ['+'] || ops == ['-'];
                match d - BRIDGE_FIRST {
                    0 => assert!(ops == ['+'] && (10..100).contains(&xs[0]) && xs[1] < 10, "{}", t.prompt),
                    1 => {
                        assert!(ops == ['+'] && xs.iter().all(|x| (10..100).contains(x)), "{}", t.prompt);
                        assert!(xs[0] % 10 + xs[1] % 10 < 10 && xs[0] / 10 + xs[1] / 10 < 10, "{}", t.prompt);
                    }
                    2 => assert!(ops == ['-'] && xs[0] < 10 && xs[1] <= xs[0], "{}", t.prompt),
                    3 => assert!(ops == ['+', '+'] && xs.iter().all(|&x| x < 10), "{}", t.prompt),
                    4 => assert!(ops == ['+'] && xs.iter().all(|x| (10..100).contains(x)), "{}", t.prompt),
                    5 => assert!(pm && xs.iter().all(|&x| x < 90), "{}", t.prompt),
                    6 => assert!(pm && xs.iter().all(|&x| x < 100) && xs.iter().any(|&x| x >= 90), "{}", t.prompt),
                    7 => assert!(pm && xs.iter().any(|&x| x >= 100) && xs.iter().any(|&x| x < 100), "{}", t.prompt),
                    _ => assert!(pm && xs.iter().all(|&x| x < 90), "{}", t.prompt),
                }
                prompts.insert(t.prompt);
            }
            // Enough distinct tasks that a held-out set is not the training set.
            assert!(prompts.len() > 40, "level {d}: {} distinct prompts", prompts.len());
        }
        assert_ne!(ArithEnv::new(BRIDGE_FIRST).task(1), ArithEnv::new(BRIDGE_FIRST + 1).task(1));
    }
}
