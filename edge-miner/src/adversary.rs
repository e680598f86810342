//! Adversarial miners (feature `adversary`): the real miner with one attack
//! switched on, for proving the validator against every attack class.
//!
//! An attack is two optional seams of [`crate::run`]: a [`Tamper`] over each
//! group's rollouts (before and after signing) and a substitute [`Loader`]
//! (the model that really generates, while the miner claims the window's
//! checkpoint). [`setup`] builds both from an [`Attack`] and its
//! [`AttackOptions`].
//!
//! | attack | what the miner does | who catches it |
//! |---|---|---|
//! | `forged-sketch` | replaces every committed sketch | validator: sketch |
//! | `stale-checkpoint` | generates with an old checkpoint and says so | door: stale checkpoint |
//! | `quantized-q4` | generates with a Q4_0 quantization of the right checkpoint | validator: model checks |
//! | `quantized-q8` | the same with Q8_0 (close to BF16; reported, not required) | validator, if at all |
//! | `other-model` | generates with another model | validator: model checks |
//! | `prefix-edit` | changes the first completion tokens | validator: sampling |
//! | `prefill-decode-split` | decodes with another model, proves (log-probs, sketches) with the right one | validator: sampling |
//! | `reward-inflation` | reports reward 1 | validator: reward |
//! | `wrong-prompt` | changes the prompt | validator: prompt |
//! | `replay` | resubmits rollouts of an earlier window, relabelled | validator: prompt |
//! | `copy` | submits another miner's completions under its own key | validator: copy |
//! | `bad-signature` | corrupts each signature | door: bad signature |

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::rollout::Rollout;
use tributary_protocol::sketch;
use tributary_protocol::wire::WindowInfo;

use crate::backend::{Backend, BackendError, GeneratedSeq, GroupRequest};
use crate::llama::{LlamaConfig, LlamaCppBackend};
use crate::quantize::{FileType, quantize};
use crate::run::Tamper;
use crate::sync::{LoadedBackend, Loader};

/// Every attack the adversarial miner knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Attack {
    /// Sketches that are not the model's.
    ForgedSketch,
    /// A checkpoint several versions old.
    StaleCheckpoint,
    /// A Q4_0 quantization of the right checkpoint.
    QuantizedQ4,
    /// A Q8_0 quantization of the right checkpoint.
    QuantizedQ8,
    /// Another model.
    OtherModel,
    /// The first completion tokens changed.
    PrefixEdit,
    /// Decode with another model, prove with the right one.
    PrefillDecodeSplit,
    /// A reward higher than earned.
    RewardInflation,
    /// A prompt other than the assigned task's.
    WrongPrompt,
    /// Rollouts of an earlier window submitted again.
    Replay,
    /// Another miner's completions.
    Copy,
    /// Signatures that do not verify.
    BadSignature,
}

impl Attack {
    /// Every attack.
    pub const ALL: [Attack; 12] = [
        Attack::ForgedSketch,
        Attack::StaleCheckpoint,
        Attack::QuantizedQ4,
        Attack::QuantizedQ8,
        Attack::OtherModel,
        Attack::PrefixEdit,
        Attack::PrefillDecodeSplit,
        Attack::RewardInflation,
        Attack::WrongPrompt,
        Attack::Replay,
        Attack::Copy,
        Attack::BadSignature,
    ];

    /// The attack's command-line name.
    pub fn as_str(self) -> &'static str {
        match self {
            Attack::ForgedSketch => "forged-sketch",
            Attack::StaleCheckpoint => "stale-checkpoint",
            Attack::QuantizedQ4 => "quantized-q4",
            Attack::QuantizedQ8 => "quantized-q8",
            Attack::OtherModel => "other-model",
            Attack::PrefixEdit => "prefix-edit",
            Attack::PrefillDecodeSplit => "prefill-decode-split",
            Attack::RewardInflation => "reward-inflation",
            Attack::WrongPrompt => "wrong-prompt",
            Attack::Replay => "replay",
            Attack::Copy => "copy",
            Attack::BadSignature => "bad-signature",
        }
    }

    /// Whether the attack needs [`AttackOptions::model`].
    pub fn needs_model(self) -> bool {
        matches!(self, Attack::StaleCheckpoint | Attack::OtherModel | Attack::PrefillDecodeSplit)
    }
}

impl std::fmt::Display for Attack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors setting up an attack.
#[derive(Debug, thiserror::Error)]
pub enum AdversaryError {
    /// Unknown attack name.
    #[error("unknown attack {0:?} (one of: {names})", names = Attack::ALL.map(Attack::as_str).join(", "))]
    Unknown(String),
    /// The attack needs an option that is missing or unusable.
    #[error("attack {attack}: {detail}")]
    Options {
        /// The attack.
        attack: Attack,
        /// What is missing.
        detail: String,
    },
}

impl FromStr for Attack {
    type Err = AdversaryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Attack::ALL.into_iter().find(|a| a.as_str() == s).ok_or_else(|| AdversaryError::Unknown(s.to_owned()))
    }
}

/// Rollouts a copier can take (filled by [`Recorder`] on the victim, or from a file).
pub type CopyPool = Arc<Mutex<Vec<Rollout>>>;

/// What an attack needs besides its name.
#[derive(Clone, Default)]
pub struct AttackOptions {
    /// The model that really generates (stale-checkpoint: the old checkpoint;
    /// other-model: any other model; prefill-decode-split: the decoding model).
    pub model: Option<PathBuf>,
    /// Folder for files the attack makes (quantizations).
    pub work_dir: Option<PathBuf>,
    /// CPU threads of substituted models.
    pub threads: usize,
    /// The copier's source of other miners' rollouts.
    pub pool: Option<CopyPool>,
}

impl std::fmt::Debug for AttackOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttackOptions")
            .field("model", &self.model)
            .field("work_dir", &self.work_dir)
            .finish_non_exhaustive()
    }
}

/// The seams an attack fills.
pub struct AttackSetup {
    /// The rollout hook.
    pub tamper: Box<dyn Tamper>,
    /// A substitute model loader, when the attack generates with another model.
    pub loader: Option<Loader>,
}

/// Builds an attack's seams.
pub fn setup(attack: Attack, opts: &AttackOptions) -> Result<AttackSetup, AdversaryError> {
    let missing = |detail: &str| AdversaryError::Options { attack, detail: detail.to_owned() };
    let threads = opts.threads.max(1);
    let model = if attack.needs_model() {
        let m = opts.model.clone().ok_or_else(|| missing("needs --attack-model FILE"))?;
        Some(m)
    } else {
        None
    };
    let mut loader = None;
    let tamper: Box<dyn Tamper> = match attack {
        Attack::ForgedSketch => Box::new(ForgedSketch),
        Attack::StaleCheckpoint => {
            let path = model.ok_or_else(|| missing("model"))?;
            let id = crate::sync::file_content_id(&path).ok_or_else(|| missing("the stale model has no content id"))?;
            loader = Some(fixed_loader(path, threads));
            Box::new(ClaimCheckpoint(id))
        }
        Attack::OtherModel => {
            loader = Some(fixed_loader(model.ok_or_else(|| missing("model"))?, threads));
            Box::new(Honest)
        }
        Attack::QuantizedQ4 | Attack::QuantizedQ8 => {
            let dir = opts.work_dir.clone().ok_or_else(|| missing("needs a work folder"))?;
            let ftype = if attack == Attack::QuantizedQ4 { FileType::Q4_0 } else { FileType::Q8_0 };
            loader = Some(quantizing_loader(dir, ftype, threads));
            Box::new(Honest)
        }
        Attack::PrefillDecodeSplit => {
            let decode = model.ok_or_else(|| missing("model"))?;
            loader = Some(Arc::new(move |prove: &Path| {
                let load =
                    |p: &Path| LlamaCppBackend::load(&LlamaConfig { model: p.to_owned(), threads, gpu_layers: 0 });
                Ok(Box::new(Split { decode: load(&decode)?, prove: load(prove)? }) as LoadedBackend)
            }));
            Box::new(Honest)
        }
        Attack::PrefixEdit => Box::new(PrefixEdit),
        Attack::RewardInflation => Box::new(RewardInflation),
        Attack::WrongPrompt => Box::new(WrongPrompt),
        Attack::Replay => Box::new(Replay::default()),
        Attack::Copy => {
            Box::new(CopyFrom(opts.pool.clone().ok_or_else(|| missing("needs --copy-from FILE (or a pool)"))?))
        }
        Attack::BadSignature => Box::new(BadSignature),
    };
    Ok(AttackSetup { tamper, loader })
}

/// Reads a copier's pool: one JSON [`Rollout`] per line.
pub fn read_pool(path: &Path) -> Result<CopyPool, AdversaryError> {
    let bad = |detail: String| AdversaryError::Options { attack: Attack::Copy, detail };
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let mut v = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        v.push(serde_json::from_str::<Rollout>(line).map_err(|e| bad(format!("line {}: {e}", i + 1)))?);
    }
    Ok(Arc::new(Mutex::new(v)))
}

/// Loads `path` whatever checkpoint the miner asks for.
fn fixed_loader(path: PathBuf, threads: usize) -> Loader {
    Arc::new(move |_asked: &Path| {
        let b = LlamaCppBackend::load(&LlamaConfig { model: path.clone(), threads, gpu_layers: 0 })?;
        Ok(Box::new(b) as LoadedBackend)
    })
}

/// Loads a quantization of the checkpoint asked for (made once per file).
fn quantizing_loader(dir: PathBuf, ftype: FileType, threads: usize) -> Loader {
    let made: Arc<Mutex<HashMap<PathBuf, PathBuf>>> = Arc::default();
    Arc::new(move |asked: &Path| {
        std::fs::create_dir_all(&dir).map_err(|e| BackendError::Load(e.to_string()))?;
        let mut made = made.lock().unwrap_or_else(|p| p.into_inner());
        let out = dir.join(format!("quantized-{}.gguf", made.len()));
        let q = match made.get(asked) {
            Some(q) => q.clone(),
            None => {
                quantize(asked, &out, ftype, threads).map_err(|e| BackendError::Load(e.to_string()))?;
                made.insert(asked.to_owned(), out.clone());
                out
            }
        };
        let b = LlamaCppBackend::load(&LlamaConfig { model: q, threads, gpu_layers: 0 })?;
        Ok(Box::new(b) as LoadedBackend)
    })
}

/// Decodes with one model, recomputes log-probs and sketches with another.
struct Split {
    decode: LlamaCppBackend,
    prove: LlamaCppBackend,
}

impl Backend for Split {
    fn generate_group(&mut self, req: &GroupRequest<'_>) -> Result<Vec<GeneratedSeq>, BackendError> {
        let mut seqs = self.decode.generate_group(req)?;
        for s in &mut seqs {
            let mut tokens = req.prompt.to_vec();
            tokens.extend_from_slice(&s.completion);
            let (sketches, logprobs) = self.prove.teacher_forced(&tokens, req.sketch_key, &req.sketch_params)?;
            s.sketches = sketches;
            s.logprobs = logprobs.get(req.prompt.len() - 1..).unwrap_or(&[]).to_vec();
        }
        Ok(seqs)
    }

    fn hidden_size(&self) -> usize {
        self.prove.hidden_size()
    }

    fn vocab_size(&self) -> usize {
        self.prove.vocab_size()
    }
}

/// Changes nothing (the attack is in the loader).
struct Honest;

impl Tamper for Honest {
    fn tamper(&mut self, _: &WindowInfo, _: &mut Vec<Rollout>) {}
}

/// Records every group it sees into a pool (installed on a victim in tests).
#[derive(Clone)]
pub struct Recorder(pub CopyPool);

impl Tamper for Recorder {
    fn tamper(&mut self, _: &WindowInfo, group: &mut Vec<Rollout>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend(group.iter().cloned());
    }
}

struct ForgedSketch;

impl Tamper for ForgedSketch {
    fn tamper(&mut self, _: &WindowInfo, group: &mut Vec<Rollout>) {
        for r in group {
            for (i, s) in r.sketches.iter_mut().enumerate() {
                *s = (*s + sketch::Q / 2 + i as u32) % sketch::Q;
            }
        }
    }
}

struct ClaimCheckpoint(ContentId);

impl Tamper for ClaimCheckpoint {
    fn tamper(&mut self, _: &WindowInfo, group: &mut Vec<Rollout>) {
        for r in group {
            r.checkpoint = self.0;
        }
    }
}

struct PrefixEdit;

impl Tamper for PrefixEdit {
    fn tamper(&mut self, _: &WindowInfo, group: &mut Vec<Rollout>) {
        for r in group {
            let p = r.prompt_len as usize;
            let n = r.tokens.len();
            for t in r.tokens.iter_mut().take(n.saturating_sub(1)).skip(p).take(3) {
                // A nearby ordinary token id (below the special tokens' range).
                *t = (*t + 17) % 40_000 + 100;
            }
        }
    }
}

struct RewardInflation;

impl Tamper for RewardInflation {
    fn tamper(&mut self, _: &WindowInfo, group: &mut Vec<Rollout>) {
        for r in group {
            r.reward = if r.reward >= 1.0 { r.reward } else { 1.0 };
        }
    }
}

struct WrongPrompt;

impl Tamper for WrongPrompt {
    fn tamper(&mut self, _: &WindowInfo, group: &mut Vec<Rollout>) {
        for r in group {
            // Drop one token from the middle of the prompt: another (easier) task.
            let p = r.prompt_len as usize;
            if p > 2 {
                r.tokens.remove(p / 2);
                r.prompt_len -= 1;
                r.sketches.remove(p / 2);
            }
        }
    }
}

/// Keeps the first window's rollouts and resubmits them, relabelled, in later windows.
#[derive(Default)]
struct Replay {
    first: Option<u64>,
    stash: Vec<Rollout>,
}

impl Tamper for Replay {
    fn tamper(&mut self, info: &WindowInfo, group: &mut Vec<Rollout>) {
        let first = *self.first.get_or_insert(info.window);
        if info.window == first {
            self.stash.extend(group.iter().cloned());
            return;
        }
        if self.stash.is_empty() {
            return;
        }
        for (i, r) in group.iter_mut().enumerate() {
            let old = &self.stash[i % self.stash.len()];
            r.tokens = old.tokens.clone();
            r.prompt_len = old.prompt_len;
            r.logprobs = old.logprobs.clone();
            r.sketches = old.sketches.clone();
            r.reward = old.reward;
        }
    }
}

/// Replaces its completions (with their prompts, log-probs and sketches) by a victim's.
struct CopyFrom(CopyPool);

impl Tamper for CopyFrom {
    fn tamper(&mut self, info: &WindowInfo, group: &mut Vec<Rollout>) {
        // The victim's rollouts of this window (waiting a moment for them), else the latest ones.
        for _ in 0..40 {
            let has = self.0.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|v| v.window == info.window);
            if has {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let pool = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let same: Vec<&Rollout> = pool.iter().filter(|v| v.window == info.window).collect();
        let source: Vec<&Rollout> = if same.is_empty() { pool.iter().rev().take(group.len()).collect() } else { same };
        if source.is_empty() {
            return;
        }
        for (i, r) in group.iter_mut().enumerate() {
            let v = source[i % source.len()];
            r.tokens = v.tokens.clone();
            r.prompt_len = v.prompt_len;
            r.logprobs = v.logprobs.clone();
            r.sketches = v.sketches.clone();
            r.reward = v.reward;
        }
    }
}

struct BadSignature;

impl Tamper for BadSignature {
    fn tamper(&mut self, _: &WindowInfo, _: &mut Vec<Rollout>) {}

    fn after_sign(&mut self, _: &WindowInfo, group: &mut Vec<Rollout>) {
        for r in group {
            r.signature[0] ^= 0x55;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Attack::ALL {
            assert_eq!(a.as_str().parse::<Attack>().unwrap(), a);
        }
        assert!(matches!("nope".parse::<Attack>(), Err(AdversaryError::Unknown(_))));
        assert!(setup(Attack::OtherModel, &AttackOptions::default()).is_err());
        assert!(setup(Attack::Copy, &AttackOptions::default()).is_err());
        assert!(setup(Attack::ForgedSketch, &AttackOptions::default()).is_ok());
    }
}
