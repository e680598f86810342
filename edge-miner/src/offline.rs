//! Offline generation (`edge-miner generate`): tasks from an environment,
//! one group of rollouts per task, one JSON record per rollout, no coordinator.
//!
//! The seed `S` stands in for the coordinator's randomness through
//! [`OfflineWindow::from_seed`] (protocol-side, so the validator derives the
//! same): window 0's seed drives tasks ([`task_seed`]), the uniform draws and
//! the sketch coefficients ([`SketchKey::derive`]); the miner key is derived
//! from `S` too. Task `t` (0-based) of the run is group `t` of that miner.
//!
//! Every record carries the run's settings ([`GenerateSettings`]: environment,
//! difficulty, data file, temperature, `max_new_tokens`, seed), so `validator
//! check` needs only the model, the file and the seed.

use std::io::Write;
use std::path::Path;

use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::env::{Environment, completion_reward, completion_text_ids, task_seed};
pub use tributary_protocol::offline::{GenerateSettings, OfflineWindow, RolloutRecord};
use tributary_protocol::sketch::{SketchKey, SketchParams};
use tributary_protocol::tokenizer::{Tokenizer, TokenizerError};

use crate::backend::{Backend, BackendError, DrawKey, GeneratedSeq, GroupRequest};

/// What an offline run generates.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Index of the first task (group): a run covers groups
    /// `first_task..first_task + tasks`, so a long run can be resumed or
    /// extended without regenerating what it already has.
    pub first_task: usize,
    /// Number of tasks (one group each).
    pub tasks: usize,
    /// Rollouts per task (G).
    pub group: usize,
    /// Most completion tokens per rollout.
    pub max_new_tokens: usize,
    /// Sampling temperature (0 = greedy).
    pub temperature: f32,
    /// Sketch parameters.
    pub sketch_params: SketchParams,
}

/// Why an offline run failed.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// Generation failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Tokenizing or detokenizing failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Writing a record failed.
    #[error("writing records: {0}")]
    Io(#[from] std::io::Error),
    /// Serializing a record failed.
    #[error("serializing a record: {0}")]
    Json(#[from] serde_json::Error),
    /// Counts that do not fit the protocol's integer types.
    #[error("invalid options: {0}")]
    Options(String),
}

/// Summary of an offline run.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GenerateSummary {
    /// Rollouts written.
    pub rollouts: usize,
    /// Completion tokens generated.
    pub completion_tokens: usize,
    /// Mean reward.
    pub mean_reward: f32,
}

/// Everything an offline run generates from, besides the backend.
#[derive(Debug, Clone, Copy)]
pub struct Job<'a> {
    /// The model's tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// Where tasks come from.
    pub env: &'a Environment,
    /// Content id of the model, recorded in every rollout when known.
    pub model: Option<ContentId>,
    /// The data file `env` was loaded from, if any (recorded with its blake3).
    pub data: Option<&'a Path>,
    /// Window randomness and miner identity.
    pub window: &'a OfflineWindow,
    /// Counts and sampling settings.
    pub opts: &'a GenerateOptions,
}

/// Generates `job.opts.tasks` groups (from `job.opts.first_task`) with `backend` and hands each record to
/// `sink` in order (task, then rollout). `on_group` is called after every group.
pub fn generate<B: Backend + ?Sized>(
    backend: &mut B,
    job: &Job<'_>,
    mut sink: impl FnMut(RolloutRecord) -> Result<(), OfflineError>,
    mut on_group: impl FnMut(usize),
) -> Result<GenerateSummary, OfflineError> {
    let Job { tokenizer, env, model, data, window, opts } = *job;
    let settings = GenerateSettings {
        env: env.id(),
        difficulty: match env {
            Environment::Arith(a) => a.difficulty(),
            Environment::Sat(_) | Environment::Gsm8k(_) => 0,
        },
        data: data.map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())),
        dataset: data.map(|p| std::fs::read(p).map(|b| *blake3::hash(&b).as_bytes())).transpose()?,
        reward: env.reward_rule(),
        temperature: opts.temperature,
        max_new_tokens: u32::try_from(opts.max_new_tokens)
            .map_err(|_| OfflineError::Options(format!("max_new_tokens {}", opts.max_new_tokens)))?,
        seed: window.seed,
    };
    let miner = *window.miner.public().as_bytes();
    let seed = window.secrets.seed;
    let key = SketchKey::derive(&seed, backend.hidden_size());
    let eog: Vec<u32> = tokenizer.eog_ids().collect();
    let mut summary = GenerateSummary::default();
    let mut reward_sum = 0.0f64;
    for t in 0..opts.tasks {
        let group = u32::try_from(opts.first_task + t)
            .map_err(|_| OfflineError::Options(format!("{} + {} tasks", opts.first_task, opts.tasks)))?;
        let task = env.task(task_seed(&seed, &miner, group));
        let prompt = tokenizer.encode(&env.prompt_text(&task))?;
        let req = GroupRequest {
            prompt: &prompt,
            group_size: opts.group,
            max_new_tokens: opts.max_new_tokens,
            temperature: opts.temperature,
            draw: DrawKey { sampling_seed: seed, miner, group },
            sketch_key: &key,
            sketch_params: opts.sketch_params,
            eog: &eog,
        };
        let seqs = backend.generate_group(&req)?;
        for (r, GeneratedSeq { completion, logprobs, sketches }) in seqs.into_iter().enumerate() {
            let reward = completion_reward(tokenizer, env, &task, &completion)?;
            let text_ids = completion_text_ids(tokenizer, &completion);
            let ended = text_ids.len() < completion.len();
            let text = tokenizer.decode(text_ids)?;
            reward_sum += f64::from(reward);
            summary.rollouts += 1;
            summary.completion_tokens += completion.len();
            let mut tokens = Vec::with_capacity(prompt.len() + completion.len());
            tokens.extend_from_slice(&prompt);
            tokens.extend_from_slice(&completion);
            sink(RolloutRecord {
                env: task.env,
                task_id: task.id,
                group,
                rollout: r as u32,
                window_seed: seed.to_string(),
                miner: hex::encode(miner),
                model: model.map(|m| m.to_string()),
                temperature: opts.temperature,
                tokens,
                prompt_len: prompt.len(),
                logprobs,
                sketches,
                eog: ended,
                completion: text,
                reward,
                settings: Some(settings.clone()),
            })?;
        }
        on_group(t + 1);
    }
    if summary.rollouts > 0 {
        summary.mean_reward = (reward_sum / summary.rollouts as f64) as f32;
    }
    Ok(summary)
}

/// A sink writing one JSON object per line.
pub fn jsonl_sink<W: Write>(mut w: W) -> impl FnMut(RolloutRecord) -> Result<(), OfflineError> {
    move |rec| {
        serde_json::to_writer(&mut w, &rec)?;
        w.write_all(b"\n")?;
        w.flush()?;
        Ok(())
    }
}
