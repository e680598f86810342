//! Durable trainer state: FP32 master weights and AdamW moments as
//! safetensors, plus `state.json` (step and file names), so the trainer can
//! be stopped and resumed exactly.
//!
//! Each save writes `weights-<step>.safetensors` and `adam-<step>.safetensors`
//! first, then replaces `state.json` atomically (temporary file + rename),
//! then deletes older files: a crash at any point leaves a consistent state.

use std::path::{Path, PathBuf};

use tch::{Device, Tensor};
use tributary_policy::ReferenceModel;
use tributary_protocol::checkpoint::ModelConfig;

use crate::train::{AdamState, TrainConfig, TrainError, Trainer};

/// Errors of saving or loading state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// File I/O.
    #[error("I/O on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// libtorch (safetensors).
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    /// The state file is malformed.
    #[error("state.json: {0}")]
    Json(#[from] serde_json::Error),
    /// Building the model failed.
    #[error("{0}")]
    Train(#[from] TrainError),
    /// The saved state does not fit the model.
    #[error("saved state: {0}")]
    Mismatch(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io { path: path.to_owned(), source }
}

/// Contents of `state.json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StateFile {
    /// Optimiser steps taken.
    pub step: u64,
    /// Model hyperparameters.
    pub config: ModelConfig,
    /// Weights file (relative to the state folder).
    pub weights: String,
    /// Optimiser file (relative to the state folder).
    pub adam: String,
}

const STATE: &str = "state.json";

/// Writes `bytes` to `path` atomically.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let res = (|| {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res.map_err(io(path))
}

/// Saves the trainer's weights, optimiser state and step into `dir`.
pub fn save(dir: &Path, trainer: &Trainer) -> Result<(), StateError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let step = trainer.steps();
    let weights = format!("weights-{step}.safetensors");
    let adam = format!("adam-{step}.safetensors");
    let mut vars: Vec<(String, Tensor)> = trainer.model().var_store().variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let wtmp = dir.join(format!("{weights}.tmp"));
    Tensor::write_safetensors(&vars, &wtmp)?;
    std::fs::rename(&wtmp, dir.join(&weights)).map_err(io(dir))?;
    let st = trainer.adam();
    let moments: Vec<(String, &Tensor)> =
        st.m.iter()
            .map(|(k, t)| (format!("m.{k}"), t))
            .chain(st.v.iter().map(|(k, t)| (format!("v.{k}"), t)))
            .collect();
    let atmp = dir.join(format!("{adam}.tmp"));
    if moments.is_empty() {
        // safetensors needs at least one tensor.
        Tensor::write_safetensors(&[("none", Tensor::zeros([1], (tch::Kind::Float, Device::Cpu)))], &atmp)?;
    } else {
        Tensor::write_safetensors(&moments, &atmp)?;
    }
    std::fs::rename(&atmp, dir.join(&adam)).map_err(io(dir))?;
    let file = StateFile { step, config: *trainer.model().dims(), weights: weights.clone(), adam: adam.clone() };
    write_atomic(&dir.join(STATE), &serde_json::to_vec_pretty(&file)?)?;
    // Older files are now unreferenced.
    for e in std::fs::read_dir(dir).map_err(io(dir))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = (name.starts_with("weights-") || name.starts_with("adam-")) && name.ends_with(".safetensors");
        if ours && name != weights && name != adam {
            let _ = std::fs::remove_file(e.path());
        }
    }
    Ok(())
}

/// Loads a trainer saved by [`save`], or `None` if `dir` has no state.
pub fn load(dir: &Path, device: Device, cfg: TrainConfig) -> Result<Option<Trainer>, StateError> {
    let path = dir.join(STATE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path)(e)),
    };
    let file: StateFile = serde_json::from_slice(&bytes)?;
    let safe = |n: &str| !n.contains('/') && !n.contains('\\') && !n.starts_with('.');
    if !safe(&file.weights) || !safe(&file.adam) {
        return Err(StateError::Mismatch("file names must be plain names in the state folder".into()));
    }
    let weights: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(dir.join(&file.weights))?.into_iter().collect();
    let model = ReferenceModel::from_fn(file.config, device, |name| match weights.get(name) {
        None => Ok(None),
        Some(t) => Ok(Some(Vec::<f32>::try_from(&t.flatten(0, -1).to_kind(tch::Kind::Float))?)),
    })
    .map_err(TrainError::from)?;
    let mut adam = AdamState { t: file.step, ..AdamState::default() };
    for (name, t) in Tensor::read_safetensors(dir.join(&file.adam))? {
        let t = t.to_device(device);
        if let Some(k) = name.strip_prefix("m.") {
            adam.m.insert(k.to_owned(), t);
        } else if let Some(k) = name.strip_prefix("v.") {
            adam.v.insert(k.to_owned(), t);
        }
    }
    let vars = model.var_store().variables();
    for (k, t) in adam.m.iter().chain(adam.v.iter()) {
        match vars.get(k) {
            Some(p) if p.size() == t.size() => {}
            _ => return Err(StateError::Mismatch(format!("optimiser moment {k} does not match a parameter"))),
        }
    }
    Ok(Some(Trainer::new(model, adam, cfg)))
}
