//! Task environments: what miner and validator must agree on — the prompt of
//! a task derived from a seed, and the reward of a completion.
//!
//! Three environments, all deterministic functions of their inputs:
//! - [`EnvId::Arith`]: procedural integer arithmetic with a difficulty knob
//!   ([`ArithEnv`]);
//! - [`EnvId::Sat`]: procedural 3-SAT, generated like grail's SAT environment
//!   ([`SatEnv`]);
//! - [`EnvId::Gsm8k`]: grade-school math from a GSM8K JSONL file ([`Gsm8kEnv`]).
//!
//! **Assignment.** The task of group `g` of a miner in a window is
//! `env.task(task_seed(window_seed, miner, g))`; coordinator, miner and
//! validator all derive it ([`task_seed`]).
//!
//! **Answer format and reward.** Every environment asks the model to end with
//! a line `Answer: ...`. The reward is binary and simple on purpose, read by
//! the window's [`RewardRule`]: by default ([`RewardRule::Strict`]) `1.0` only
//! when the last non-empty line is a well-formed `Answer: N` with the right
//! `N` ([`final_answer_line`]), else `0.0`. The lenient reading
//! ([`extract_number`], [`TaskAnswer::reward`]: the last number after a
//! marker, else the last number anywhere) is kept as a metric and as the rule
//! of older records; [`RewardRule::Format`] pays a well-formed answer line
//! whatever its value (a control for format learning).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::chat::{chatml_prompt, chatml_prompt_with_examples};
use crate::prf::{Seed, labels, prf_u64};
use crate::tokenizer::{Tokenizer, TokenizerError};

mod answer;
mod arith;
mod gsm8k;
mod sat;

pub use answer::{RewardRule, UnknownRewardRule, extract_number, final_answer_line, normalize_number, strict_number};
pub use arith::{
    ArithEnv, BRIDGE_FIRST, BRIDGE_LEVELS, COMMUTATIVE_SPLIT_FIRST, MAX_DIFFICULTY, PRACTICE_LEVEL, WORKED_EXAMPLES,
    WORKED_LEVELS, WORKED_OFFSET,
};
pub use gsm8k::{Gsm8kEnv, Gsm8kItem};
pub use sat::{SatEnv, SatProblem};

/// Which environment a task comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvId {
    /// Procedural arithmetic.
    Arith,
    /// Procedural 3-SAT.
    Sat,
    /// GSM8K.
    Gsm8k,
}

impl EnvId {
    /// The lowercase name (`"arith"`, `"sat"`, `"gsm8k"`).
    pub fn as_str(&self) -> &'static str {
        match self {
            EnvId::Arith => "arith",
            EnvId::Sat => "sat",
            EnvId::Gsm8k => "gsm8k",
        }
    }
}

impl fmt::Display for EnvId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of the environments (bad names, unreadable or malformed data files).
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// Unknown environment name.
    #[error("unknown environment {0:?} (expected arith, sat or gsm8k)")]
    UnknownEnv(String),
    /// Reading a data file failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A JSONL line could not be parsed.
    #[error("line {line}: {reason}")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        reason: String,
    },
    /// The data file holds no items.
    #[error("dataset is empty")]
    Empty,
    /// The environment draws from a data file and none was given.
    #[error("the {0} environment needs its data file (--gsm8k / --data FILE.jsonl)")]
    MissingData(EnvId),
    /// The data file given is not the one the window names (blake3 differs).
    #[error("{path} is not the dataset the window names (blake3 {found}, expected {expected})")]
    WrongData {
        /// The file given.
        path: String,
        /// Its blake3, hex.
        found: String,
        /// The blake3 the window names, hex.
        expected: String,
    },
}

impl FromStr for EnvId {
    type Err = EnvError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "arith" => Ok(EnvId::Arith),
            "sat" => Ok(EnvId::Sat),
            "gsm8k" => Ok(EnvId::Gsm8k),
            _ => Err(EnvError::UnknownEnv(s.to_owned())),
        }
    }
}

/// The reference answer of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskAnswer {
    /// A number, as a normalized decimal string ([`normalize_number`]).
    Number(String),
    /// A 3-SAT instance; any satisfying assignment is correct.
    Sat(SatProblem),
    /// A number, with partial credit for brevity when wrong: the arith
    /// practice level of `--dev` networks ([`PRACTICE_LEVEL`]).
    Practice(String),
}

impl TaskAnswer {
    /// Reward of a completion under `rule`. The practice level ignores the
    /// rule (its shaped reward is [`TaskAnswer::reward`]'s); otherwise
    /// [`RewardRule::Lenient`] is [`TaskAnswer::reward`], [`RewardRule::Strict`]
    /// pays `1.0` only for a well-formed final `Answer:` line
    /// ([`strict_number`], [`SatProblem::parse_strict_assignment`]) holding a
    /// correct answer, and [`RewardRule::Format`] pays `1.0` for any
    /// well-formed final `Answer:` line.
    pub fn score(&self, rule: RewardRule, completion: &str) -> f32 {
        let ok = match (self, rule) {
            (TaskAnswer::Practice(_), _) | (_, RewardRule::Lenient) => return self.reward(completion),
            (TaskAnswer::Number(want), RewardRule::Strict) => strict_number(completion).is_some_and(|n| &n == want),
            (TaskAnswer::Number(_), RewardRule::Format) => strict_number(completion).is_some(),
            (TaskAnswer::Sat(p), RewardRule::Strict) => {
                p.parse_strict_assignment(completion).is_some_and(|a| p.satisfied_by(&a))
            }
            (TaskAnswer::Sat(p), RewardRule::Format) => p.parse_strict_assignment(completion).is_some(),
        };
        if ok { 1.0 } else { 0.0 }
    }

    /// The lenient reward of a completion ([`RewardRule::Lenient`]): `1.0` if
    /// its answer is correct, else `0.0`.
    /// Numbers: [`extract_number`] then exact comparison of normalized
    /// decimals. SAT: [`SatProblem::parse_assignment`], then every clause
    /// must be satisfied. Practice: as a number, but a wrong answer earns
    /// [`practice_credit`] instead of `0.0`.
    pub fn reward(&self, completion: &str) -> f32 {
        let ok = match self {
            TaskAnswer::Number(want) | TaskAnswer::Practice(want) => {
                extract_number(completion).is_some_and(|got| &got == want)
            }
            TaskAnswer::Sat(p) => p.parse_assignment(completion).is_some_and(|a| p.satisfied_by(&a)),
        };
        match self {
            _ if ok => 1.0,
            TaskAnswer::Practice(_) => practice_credit(completion),
            _ => 0.0,
        }
    }
}

/// The practice level's credit for a wrong answer: `0.5 · 16 / (16 + n)`
/// for a completion of `n` characters (`0.5` when empty, falling with
/// length). Computed in `f32` with one correctly rounded division, so every
/// machine gets the same bits.
pub fn practice_credit(completion: &str) -> f32 {
    let n = completion.chars().count().min(1 << 20) as f32;
    0.5 * (16.0 / (16.0 + n))
}

/// Which side of the problem-level train/test split a problem is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// Windows assign it and the trainer learns from it.
    Train,
    /// Held out: only evaluation sees it ([`Environment::test_problems`]).
    Test,
}

/// Share of the procedural problems held out for evaluation, in 1/65 536
/// (8 192: one in eight).
pub const TEST_SHARE: u32 = 8_192;

/// Most redraws [`Environment::task`] makes for a held-out problem (the
/// chance that all are held out is 8⁻⁶⁴).
const MAX_REDRAWS: u32 = 64;

/// The split of a problem, by its canonical text: blake3 (derive-key mode,
/// [`crate::domain::context::PROBLEM_SPLIT`]) over the environment's name and
/// the user message; the first two bytes (LE) below [`TEST_SHARE`] mean test.
/// A problem is on one side whatever seed drew it, so a held-out problem is
/// never trained on under another seed.
pub fn problem_split(env: EnvId, prompt: &str) -> Split {
    let mut h = blake3::Hasher::new_derive_key(crate::domain::context::PROBLEM_SPLIT);
    h.update(env.as_str().as_bytes());
    h.update(&[0]);
    h.update(prompt.as_bytes());
    let b = h.finalize();
    let x = u32::from(u16::from_le_bytes([b.as_bytes()[0], b.as_bytes()[1]]));
    if x < TEST_SHARE { Split::Test } else { Split::Train }
}

/// One task: the user message and its reference answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// The environment.
    pub env: EnvId,
    /// The task seed it was derived from ([`task_seed`]).
    pub id: u64,
    /// The user message (rendered into ChatML by [`Environment::prompt_text`]).
    pub prompt: String,
    /// The reference answer.
    pub answer: TaskAnswer,
}

/// The seed of group `group` of `miner` in a window:
/// `PRF(TASK, [window_seed, miner, group LE32])` as `u64`.
pub fn task_seed(window_seed: &Seed, miner: &[u8; 32], group: u32) -> u64 {
    prf_u64(labels::TASK, &[&window_seed.0, miner, &group.to_le_bytes()])
}

/// System prompt of the numeric environments.
pub const NUMERIC_SYSTEM_PROMPT: &str = "You are a careful math assistant. Solve the problem step by step, \
then end your response with a final line of the form \"Answer: <number>\".";

/// System prompt of the SAT environment.
pub const SAT_SYSTEM_PROMPT: &str = "You are a careful logic assistant. Find an assignment that satisfies \
every clause, then end your response with a final line of the form \"Answer: \" followed by one 0 or 1 per \
variable, x1 first, separated by spaces.";

/// A configured environment.
#[derive(Debug, Clone)]
pub enum Environment {
    /// Procedural arithmetic.
    Arith(ArithEnv),
    /// Procedural 3-SAT.
    Sat(SatEnv),
    /// GSM8K.
    Gsm8k(Gsm8kEnv),
}

/// What picks an environment: the settings a window announces
/// ([`crate::wire::WindowInfo`]) and an offline record carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EnvSpec {
    /// Which environment.
    pub env: EnvId,
    /// Difficulty of the procedural environments (arith).
    pub difficulty: u32,
    /// blake3 of the data file the environment draws from (gsm8k), when it is pinned.
    pub dataset: Option<[u8; 32]>,
    /// How completions are scored.
    pub reward: RewardRule,
}

impl Environment {
    /// The one way every role builds an environment: from the settings a
    /// window (or an offline record) names, plus the local data file for an
    /// environment that draws from one. When `spec.dataset` is set, the file's
    /// blake3 must be that hash, so miner and validator score the same problems.
    pub fn build(spec: &EnvSpec, data: Option<&std::path::Path>) -> Result<Self, EnvError> {
        Ok(match spec.env {
            EnvId::Arith => Environment::Arith(ArithEnv::new(spec.difficulty)),
            EnvId::Sat => Environment::Sat(SatEnv::default()),
            EnvId::Gsm8k => {
                let path = data.ok_or(EnvError::MissingData(EnvId::Gsm8k))?;
                let text = std::fs::read_to_string(path)
                    .map_err(|source| EnvError::Io { path: path.display().to_string(), source })?;
                if let Some(expected) = spec.dataset {
                    let found = blake3::hash(text.as_bytes());
                    if found.as_bytes() != &expected {
                        return Err(EnvError::WrongData {
                            path: path.display().to_string(),
                            found: found.to_hex().to_string(),
                            expected: hex::encode(expected),
                        });
                    }
                }
                Environment::Gsm8k(Gsm8kEnv::from_jsonl(&text)?)
            }
        }
        .with_reward(spec.reward))
    }

    /// This environment scoring with `rule`.
    pub fn with_reward(self, rule: RewardRule) -> Self {
        match self {
            Environment::Arith(e) => Environment::Arith(e.with_reward(rule)),
            Environment::Sat(e) => Environment::Sat(e.with_reward(rule)),
            Environment::Gsm8k(e) => Environment::Gsm8k(e.with_reward(rule)),
        }
    }

    /// How this environment scores completions.
    pub fn reward_rule(&self) -> RewardRule {
        match self {
            Environment::Arith(e) => e.reward_rule(),
            Environment::Sat(e) => e.reward_rule(),
            Environment::Gsm8k(e) => e.reward_rule(),
        }
    }

    /// Which side of the split `task` (a problem of this environment) is on:
    /// [`problem_split`] of its [split key](ArithEnv::split_key).
    pub fn split_of(&self, task: &Task) -> Split {
        match self {
            Environment::Arith(e) => problem_split(task.env, &e.split_key(&task.prompt)),
            _ => problem_split(task.env, &task.prompt),
        }
    }

    /// The environment of a window: [`Environment::build`] with the settings
    /// the window announces.
    pub fn for_window(info: &crate::wire::WindowInfo, data: Option<&std::path::Path>) -> Result<Self, EnvError> {
        Self::build(&info.env_spec(), data)
    }

    /// Which environment this is.
    pub fn id(&self) -> EnvId {
        match self {
            Environment::Arith(_) => EnvId::Arith,
            Environment::Sat(_) => EnvId::Sat,
            Environment::Gsm8k(_) => EnvId::Gsm8k,
        }
    }

    /// The system prompt sent with every task of this environment.
    pub fn system_prompt(&self) -> &'static str {
        match self {
            Environment::Arith(_) | Environment::Gsm8k(_) => NUMERIC_SYSTEM_PROMPT,
            Environment::Sat(_) => SAT_SYSTEM_PROMPT,
        }
    }

    /// The task for `task_seed` (deterministic): what a window assigns and
    /// training sees. A procedural environment never returns a problem of the
    /// test split ([`problem_split`]): when the seed's own problem is held
    /// out, it draws again from `(seed, k)` for `k = 1, 2, ...` until the
    /// problem is a training one, and the task keeps `id = task_seed`. GSM8K's
    /// test problems are its own test file, so its tasks are drawn as they are.
    pub fn task(&self, task_seed: u64) -> Task {
        if let Environment::Gsm8k(e) = self {
            return e.task(task_seed);
        }
        let mut task = self.problem(task_seed);
        for k in 1..=MAX_REDRAWS {
            if self.split_of(&task) == Split::Train {
                break;
            }
            let redraw = prf_u64(labels::ENV, &[b"train-redraw", &task_seed.to_le_bytes(), &k.to_le_bytes()]);
            task = self.problem(redraw);
        }
        Task { id: task_seed, ..task }
    }

    /// The problem a seed stands for, before the train/test split.
    fn problem(&self, seed: u64) -> Task {
        match self {
            Environment::Arith(e) => e.task(seed),
            Environment::Sat(e) => e.task(seed),
            Environment::Gsm8k(e) => e.task(seed),
        }
    }

    /// `n` distinct held-out problems (fewer if the environment has fewer),
    /// the same on every machine: for a procedural environment, the test
    /// split's problems in the order of a fixed seed stream (each distinct
    /// prompt once); for GSM8K, the first `n` items of the loaded file (load
    /// the test file to evaluate).
    pub fn test_problems(&self, n: usize) -> Vec<Task> {
        self.problems_of(n, Some(Split::Test))
    }

    /// `n` distinct problems from either side of the split (fewer if the
    /// environment has fewer), the same on every machine, in the order of
    /// the same fixed seed stream as [`Environment::test_problems`]: for
    /// evaluating on a level no window of the network assigns (an operand
    /// band or an out-of-distribution level). Distinct means distinct split
    /// keys, so `a + b` and `b + a` count once from
    /// [`COMMUTATIVE_SPLIT_FIRST`] on. GSM8K: the first `n` items.
    pub fn distinct_problems(&self, n: usize) -> Vec<Task> {
        self.problems_of(n, None)
    }

    fn problems_of(&self, n: usize, split: Option<Split>) -> Vec<Task> {
        if let Environment::Gsm8k(e) = self {
            return (0..e.len().min(n)).map(|i| e.task_at(i)).collect();
        }
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(n);
        let attempts = (n as u64).saturating_mul(256).saturating_add(4096);
        for i in 0..attempts {
            if out.len() == n {
                break;
            }
            let seed = prf_u64(labels::ENV, &[b"test-problem", &i.to_le_bytes()]);
            let task = self.problem(seed);
            let key = match self {
                Environment::Arith(e) => e.split_key(&task.prompt).into_owned(),
                _ => task.prompt.clone(),
            };
            if split.is_none_or(|s| self.split_of(&task) == s) && seen.insert(key) {
                out.push(task);
            }
        }
        out
    }

    /// The full prompt text: ChatML with this environment's system prompt
    /// (and, on a [worked-example level](WORKED_LEVELS), its worked examples
    /// as earlier turns).
    pub fn prompt_text(&self, task: &Task) -> String {
        match self {
            Environment::Arith(e) if WORKED_LEVELS.contains(&e.difficulty()) => {
                chatml_prompt_with_examples(Some(self.system_prompt()), &e.worked_examples(), &task.prompt)
            }
            _ => chatml_prompt(Some(self.system_prompt()), &task.prompt),
        }
    }

    /// Reward of `completion` for `task` under this environment's rule
    /// ([`TaskAnswer::score`]).
    pub fn reward(&self, task: &Task, completion: &str) -> f32 {
        task.answer.score(self.reward_rule(), completion)
    }
}

/// The completion's text ids: the completion without its final
/// end-of-generation token (the text a reward is computed on).
pub fn completion_text_ids<'a>(tokenizer: &Tokenizer, completion: &'a [u32]) -> &'a [u32] {
    match completion.split_last() {
        Some((&last, rest)) if tokenizer.is_eog(last) => rest,
        _ => completion,
    }
}

/// The reward of a completion, as miner, validator and trainer all compute
/// it: [`completion_text_ids`] decoded, then [`Environment::reward`]. `Err`
/// when an id is outside the vocabulary.
pub fn completion_reward(
    tokenizer: &Tokenizer,
    env: &Environment,
    task: &Task,
    completion: &[u32],
) -> Result<f32, TokenizerError> {
    let text = tokenizer.decode(completion_text_ids(tokenizer, completion))?;
    Ok(env.reward(task, &text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_id_names() {
        for e in [EnvId::Arith, EnvId::Sat, EnvId::Gsm8k] {
            assert_eq!(e.to_string().parse::<EnvId>().unwrap(), e);
            assert_eq!(serde_json::to_string(&e).unwrap(), format!("\"{e}\""));
        }
        assert_eq!("GSM8K".parse::<EnvId>().unwrap(), EnvId::Gsm8k);
        assert!("math".parse::<EnvId>().is_err());
    }

    #[test]
    fn task_seed_binds_context() {
        let s = Seed([5; 32]);
        let a = task_seed(&s, &[1; 32], 0);
        assert_eq!(a, task_seed(&s, &[1; 32], 0));
        assert_ne!(a, task_seed(&s, &[1; 32], 1));
        assert_ne!(a, task_seed(&s, &[2; 32], 0));
        assert_ne!(a, task_seed(&Seed([6; 32]), &[1; 32], 0));
    }

    #[test]
    fn environment_dispatch() {
        let env = Environment::Arith(ArithEnv::new(2));
        let t = env.task(42);
        assert_eq!(t, env.task(42));
        assert_eq!(t.env, EnvId::Arith);
        assert_eq!(t.id, 42);
        let text = env.prompt_text(&t);
        assert!(text.starts_with("<|im_start|>system\nYou are a careful math assistant."));
        assert!(text.ends_with("<|im_start|>assistant\n"));
        let TaskAnswer::Number(n) = &t.answer else { panic!("arith answers are numbers") };
        // Strict by default: only a final `Answer: N` line pays.
        assert_eq!(env.reward_rule(), RewardRule::Strict);
        assert_eq!(env.reward(&t, &format!("{} = {n}\nAnswer: {n}", t.prompt)), 1.0);
        assert_eq!(env.reward(&t, &format!("so... Answer: {n}")), 0.0);
        assert_eq!(env.reward(&t, "Answer: 1.5e9"), 0.0);
        let lenient = env.clone().with_reward(RewardRule::Lenient);
        assert_eq!(lenient.reward(&t, &format!("so... Answer: {n}")), 1.0);
    }

    #[test]
    fn strict_pays_only_a_well_formed_final_answer_and_format_ignores_correctness() {
        let task = Task {
            env: EnvId::Arith,
            id: 0,
            prompt: "Compute 35 - 48.".into(),
            answer: TaskAnswer::Number("-13".into()),
        };
        // (completion, strict, lenient, format)
        let cases = [
            ("35 - 48 = -13\nAnswer: -13", 1.0, 1.0, 1.0),
            ("Answer: -13", 1.0, 1.0, 1.0),
            ("Answer: 13", 0.0, 0.0, 1.0),
            ("35 - 48 = -13", 0.0, 1.0, 0.0),
            ("The answer is -13.", 0.0, 1.0, 0.0),
            ("Answer: -13\nI hope this helps.", 0.0, 1.0, 0.0),
            ("Answer: -13 or maybe 13", 0.0, 1.0, 0.0),
            ("answer: -13", 0.0, 1.0, 0.0),
            ("", 0.0, 0.0, 0.0),
        ];
        for (text, strict, lenient, format) in cases {
            assert_eq!(task.answer.score(RewardRule::Strict, text), strict, "strict {text:?}");
            assert_eq!(task.answer.score(RewardRule::Lenient, text), lenient, "lenient {text:?}");
            assert_eq!(task.answer.reward(text), lenient, "reward() is the lenient rule {text:?}");
            assert_eq!(task.answer.score(RewardRule::Format, text), format, "format {text:?}");
        }
        // SAT: the final line holds exactly one 0/1 per variable.
        let sat = Task {
            env: EnvId::Sat,
            id: 0,
            prompt: String::new(),
            answer: TaskAnswer::Sat(SatProblem { num_vars: 3, clauses: vec![[1, -2, 3]] }),
        };
        for (text, strict, lenient, format) in [
            ("Answer: 1 0 1", 1.0, 1.0, 1.0),
            ("Answer: 0 1 0", 0.0, 0.0, 1.0),
            ("I pick\n[1, 0, 1]", 0.0, 1.0, 0.0),
            ("Answer: 1 0 1\nDone.", 0.0, 1.0, 0.0),
            ("Answer: 1 0", 0.0, 0.0, 0.0),
        ] {
            assert_eq!(sat.answer.score(RewardRule::Strict, text), strict, "strict {text:?}");
            assert_eq!(sat.answer.score(RewardRule::Lenient, text), lenient, "lenient {text:?}");
            assert_eq!(sat.answer.score(RewardRule::Format, text), format, "format {text:?}");
        }
        // The practice level keeps its shaped reward under every rule.
        let practice = ArithEnv::new(PRACTICE_LEVEL).task(3);
        for rule in RewardRule::ALL {
            assert_eq!(practice.answer.score(rule, "abc"), practice.answer.reward("abc"));
        }
        // A window's rule reaches every environment it builds.
        for rule in RewardRule::ALL {
            for env in [EnvId::Arith, EnvId::Sat] {
                let spec = EnvSpec { env, difficulty: 105, dataset: None, reward: rule };
                assert_eq!(Environment::build(&spec, None).unwrap().reward_rule(), rule);
            }
        }
    }

    #[test]
    fn mixed_levels_split_a_sum_and_its_swapped_twin_together() {
        let train = Environment::Arith(ArithEnv::new(105));
        let mut negative = 0;
        let mut swapped_pairs = 0;
        for seed in 0..4_000u64 {
            let t = train.task(seed);
            let (a, op, b) = operands(&t.prompt);
            assert!(a < 90 && b < 90, "{}", t.prompt);
            negative += usize::from(matches!(&t.answer, TaskAnswer::Number(n) if n.starts_with('-')));
            if op == '+' && a != b {
                swapped_pairs += 1;
                let twin = Task { prompt: format!("Compute {b} + {a}."), ..t.clone() };
                assert_eq!(train.split_of(&twin), Split::Train, "{} trains, its twin must too", t.prompt);
            }
        }
        assert!(negative > 800 && swapped_pairs > 1_000, "{negative} negative, {swapped_pairs} sums");
        // No held-out problem's twin is ever trained on.
        let test = train.test_problems(300);
        assert_eq!(test.len(), 300);
        let trained: std::collections::HashSet<String> = (0..20_000u64).map(|s| train.task(s).prompt).collect();
        for t in &test {
            let (a, op, b) = operands(&t.prompt);
            assert!(!trained.contains(&t.prompt), "{}", t.prompt);
            if op == '+' {
                assert!(!trained.contains(&format!("Compute {b} + {a}.")), "{}'s twin is trained", t.prompt);
            }
        }
        // The band and out-of-distribution levels share no problem with 105.
        let band = Environment::Arith(ArithEnv::new(106)).distinct_problems(500);
        assert_eq!(band.len(), 500);
        for t in &band {
            let (a, _, b) = operands(&t.prompt);
            assert!(a.max(b) >= 90 && a < 100 && b < 100, "{}", t.prompt);
        }
        let ood = Environment::Arith(ArithEnv::new(107)).distinct_problems(500);
        assert_eq!(ood.len(), 500);
        for t in &ood {
            let (a, _, b) = operands(&t.prompt);
            let (big, small) = (a.max(b), a.min(b));
            assert!((100..1000).contains(&big) && (10..100).contains(&small), "{}", t.prompt);
        }
        let keys: std::collections::HashSet<String> =
            band.iter().map(|t| ArithEnv::new(106).split_key(&t.prompt).into_owned()).collect();
        assert_eq!(keys.len(), band.len(), "distinct up to commutation");
        // Levels before 105 keep splitting by the exact text.
        assert_eq!(ArithEnv::new(104).split_key("Compute 56 + 12."), "Compute 56 + 12.");
        assert_eq!(ArithEnv::new(105).split_key("Compute 56 + 12."), "Compute 12 + 56.");
        assert_eq!(ArithEnv::new(105).split_key("Compute 56 - 12."), "Compute 56 - 12.");
    }

    #[test]
    fn the_subtraction_level_trains_on_the_mixed_levels_problems_mostly_subtracting() {
        let (mixed, sub) = (Environment::Arith(ArithEnv::new(105)), Environment::Arith(ArithEnv::new(108)));
        let seeds = 0..8_000u64;
        let minus = seeds.clone().filter(|&s| operands(&sub.task(s).prompt).1 == '-').count();
        // Three in four (8,000 draws: 6,000 ± 4.4 standard deviations).
        assert!((5_830..=6_170).contains(&minus), "{minus} of 8000 subtract");
        let minus_105 = seeds.clone().filter(|&s| operands(&mixed.task(s).prompt).1 == '-').count();
        assert!((3_830..=4_170).contains(&minus_105), "105 stays half and half: {minus_105}");
        // The same problems and the same split: every 108 problem is one 105
        // can ask, on the same side, and no 108 task is a 105 test problem
        // (or a sum's swapped twin of one).
        let test: std::collections::HashSet<String> = mixed
            .test_problems(500)
            .into_iter()
            .map(|t| ArithEnv::new(105).split_key(&t.prompt).into_owned())
            .collect();
        assert_eq!(test.len(), 500);
        for seed in seeds {
            let t = sub.task(seed);
            let (a, _, b) = operands(&t.prompt);
            assert!(a < 90 && b < 90, "{}", t.prompt);
            assert_eq!(sub.split_of(&t), Split::Train, "{}", t.prompt);
            assert_eq!(mixed.split_of(&t), Split::Train, "{}", t.prompt);
            assert!(!test.contains(ArithEnv::new(108).split_key(&t.prompt).as_ref()), "{} is held out", t.prompt);
        }
        // Its worked-example level asks the same tasks with 115's prompt.
        let worked = Environment::Arith(ArithEnv::new(118));
        for seed in 0..200 {
            assert_eq!(worked.task(seed), sub.task(seed));
        }
        let t = worked.task(3);
        let plain = Environment::Arith(ArithEnv::new(115)).prompt_text(&t);
        assert_eq!(worked.prompt_text(&t), plain, "118 shows 115's worked examples");
    }

    /// `Compute a op b.` as `(a, op, b)`.
    fn operands(prompt: &str) -> (u64, char, u64) {
        let e: Vec<&str> = prompt.trim_start_matches("Compute ").trim_end_matches('.').split(' ').collect();
        (e[0].parse().unwrap(), e[1].chars().next().unwrap(), e[2].parse().unwrap())
    }

    #[test]
    fn training_never_draws_a_held_out_problem() {
        for env in [
            Environment::Arith(ArithEnv::new(104)),
            Environment::Arith(ArithEnv::new(3)),
            Environment::Arith(ArithEnv::new(102)),
            Environment::Sat(SatEnv::default()),
        ] {
            let mut redrawn = 0;
            for seed in 0..2_000u64 {
                let t = env.task(seed);
                assert_eq!(t.id, seed);
                assert_eq!(t, env.task(seed), "deterministic");
                assert_eq!(problem_split(t.env, &t.prompt), Split::Train, "{}", t.prompt);
                let raw = env.problem(seed);
                if raw.prompt != t.prompt {
                    redrawn += 1;
                    assert_eq!(problem_split(raw.env, &raw.prompt), Split::Test);
                }
            }
            // About one seed in eight lands on a held-out problem and is redrawn;
            // every other task is the seed's own problem.
            assert!((120..=400).contains(&redrawn), "{:?}: {redrawn} of 2000 redrawn", env.id());
        }
    }

    #[test]
    fn test_problems_are_held_out_distinct_and_fixed() {
        let env = Environment::Arith(ArithEnv::new(104));
        let test = env.test_problems(200);
        assert_eq!(test.len(), 200);
        assert_eq!(test, env.test_problems(200), "the same on every call");
        let prompts: std::collections::HashSet<&str> = test.iter().map(|t| t.prompt.as_str()).collect();
        assert_eq!(prompts.len(), 200, "distinct problems, not distinct seeds");
        assert!(test.iter().all(|t| problem_split(t.env, &t.prompt) == Split::Test));
        for seed in 0..5_000u64 {
            assert!(!prompts.contains(env.task(seed).prompt.as_str()), "seed {seed} trains on a test problem");
        }
        // A level with fewer held-out problems than asked gives what it has.
        let small = Environment::Arith(ArithEnv::new(102)).test_problems(1_000);
        assert!(!small.is_empty() && small.len() < 55, "{} of level 102's 55 problems", small.len());
    }

    #[test]
    fn gsm8k_tests_are_the_loaded_file() {
        let env = Environment::Gsm8k(
            Gsm8kEnv::from_jsonl(
                "{\"question\": \"a?\", \"answer\": \"#### 1\"}\n{\"question\": \"b?\", \"answer\": \"#### 2\"}",
            )
            .unwrap(),
        );
        let t = env.test_problems(5);
        assert_eq!(t.iter().map(|t| t.prompt.as_str()).collect::<Vec<_>>(), ["a?", "b?"]);
        assert_eq!(env.task(7), env.problem(7), "GSM8K's split is its files");
    }
}
