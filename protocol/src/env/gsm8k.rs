//! GSM8K from a JSONL file (`{"question": ..., "answer": "... #### 72"}` per line).

use std::path::Path;
use std::sync::Arc;

use super::{EnvError, EnvId, RewardRule, Task, TaskAnswer, normalize_number};

/// One GSM8K item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gsm8kItem {
    /// The question text.
    pub question: String,
    /// The final answer (text after `####`), normalized.
    pub answer: String,
}

/// The GSM8K environment. The task for seed `s` is item
/// `⌊s · len / 2⁶⁴⌋` (file order); the user message is the question.
#[derive(Debug, Clone)]
pub struct Gsm8kEnv {
    items: Arc<Vec<Gsm8kItem>>,
    reward: RewardRule,
}

#[derive(serde::Deserialize)]
struct Line {
    question: String,
    answer: String,
}

impl Gsm8kEnv {
    /// Loads a JSONL file; every non-blank line must be a valid item.
    pub fn load(path: &Path) -> Result<Self, EnvError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| EnvError::Io { path: path.display().to_string(), source })?;
        Self::from_jsonl(&text)
    }

    /// Parses JSONL text; rejects malformed lines, answers without a numeric
    /// `#### N` and empty datasets.
    pub fn from_jsonl(text: &str) -> Result<Self, EnvError> {
        let mut items = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            let bad = |reason: String| EnvError::BadLine { line: i + 1, reason };
            let line: Line = serde_json::from_str(raw).map_err(|e| bad(e.to_string()))?;
            let (_, fin) = line.answer.rsplit_once("####").ok_or_else(|| bad("answer has no ####".into()))?;
            let answer = normalize_number(fin).ok_or_else(|| bad(format!("final answer {fin:?} is not a number")))?;
            items.push(Gsm8kItem { question: line.question, answer });
        }
        if items.is_empty() {
            return Err(EnvError::Empty);
        }
        Ok(Self { items: Arc::new(items), reward: RewardRule::default() })
    }

    /// This environment scoring with `rule`.
    pub fn with_reward(self, rule: RewardRule) -> Self {
        Self { reward: rule, ..self }
    }

    /// The reward rule ([`RewardRule::Strict`] unless set).
    pub fn reward_rule(&self) -> RewardRule {
        self.reward
    }

    /// Number of items (never 0).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Always `false` (empty datasets are rejected at load).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The items.
    pub fn items(&self) -> &[Gsm8kItem] {
        &self.items
    }

    /// Index of the item for `seed`.
    pub fn index(&self, seed: u64) -> usize {
        ((u128::from(seed) * self.items.len() as u128) >> 64) as usize
    }

    /// The task of item `i` (`id = i`); `i` past the end wraps around.
    pub fn task_at(&self, i: usize) -> Task {
        let item = &self.items[i % self.items.len()];
        Task {
            env: EnvId::Gsm8k,
            id: i as u64,
            prompt: item.question.clone(),
            answer: TaskAnswer::Number(item.answer.clone()),
        }
    }

    /// The task for `seed`.
    pub fn task(&self, seed: u64) -> Task {
        let item = &self.items[self.index(seed)];
        Task {
            env: EnvId::Gsm8k,
            id: seed,
            prompt: item.question.clone(),
            answer: TaskAnswer::Number(item.answer.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r##"{"question": "Q one?", "answer": "work\n#### 1,000"}

{"question": "Q two?", "answer": "x = <<2*3=6>>6\n#### -6"}
"##;

    #[test]
    fn parses_and_selects() {
        let env = Gsm8kEnv::from_jsonl(SAMPLE).unwrap();
        assert_eq!(env.len(), 2);
        assert_eq!(env.items()[0].answer, "1000");
        assert_eq!(env.items()[1].answer, "-6");
        assert_eq!(env.index(0), 0);
        assert_eq!(env.index(u64::MAX), 1);
        let t = env.task(u64::MAX);
        assert_eq!(t.prompt, "Q two?");
        assert_eq!(t.answer.reward("so x = 6... Answer: -6"), 1.0);
        assert_eq!(t.answer.reward("Answer: 6"), 0.0);
        assert_eq!(env.task(0).answer.reward("It is $1,000."), 1.0);
    }

    #[test]
    fn rejects_bad_files() {
        assert!(matches!(Gsm8kEnv::from_jsonl(""), Err(EnvError::Empty)));
        assert!(matches!(Gsm8kEnv::from_jsonl("{"), Err(EnvError::BadLine { line: 1, .. })));
        let no_hash = r##"{"question": "q", "answer": "7"}"##;
        assert!(matches!(Gsm8kEnv::from_jsonl(no_hash), Err(EnvError::BadLine { line: 1, .. })));
        let not_num = "{\"question\": \"q\", \"answer\": \"#### seven\"}";
        assert!(matches!(Gsm8kEnv::from_jsonl(not_num), Err(EnvError::BadLine { .. })));
        assert!(matches!(Gsm8kEnv::load(Path::new("/nonexistent/x.jsonl")), Err(EnvError::Io { .. })));
    }
}
