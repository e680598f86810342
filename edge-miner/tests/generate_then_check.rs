//! `edge-miner generate` followed by `validator check` as a new user runs
//! them (issue 19 item 7): the records carry the settings they were
//! generated with, so the check needs only the model, the file and the seed.

mod common;

use std::io::BufWriter;

use edge_miner::llama::{LlamaConfig, LlamaCppBackend};
use edge_miner::offline::{self, GenerateOptions, OfflineWindow, RolloutRecord};
use tributary_protocol::env::{ArithEnv, EnvId, Environment};
use tributary_protocol::sketch::SketchParams;
use tributary_protocol::tokenizer::Tokenizer;

#[test]
fn check_reads_the_difficulty_the_rollouts_were_generated_at() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::write_tiny(dir.path(), 7);
    let tokenizer = Tokenizer::from_gguf_file(&model).unwrap();
    let mut backend = LlamaCppBackend::load(&LlamaConfig { threads: 1, ..LlamaConfig::new(&model) }).unwrap();
    let seed = 11;
    let window = OfflineWindow::from_seed(seed);
    let env = Environment::Arith(ArithEnv::new(102));
    let opts = GenerateOptions {
        first_task: 0,
        tasks: 2,
        group: 2,
        max_new_tokens: 24,
        temperature: 0.7,
        sketch_params: SketchParams::DEFAULT,
    };
    let job = offline::Job { tokenizer: &tokenizer, env: &env, model: None, data: None, window: &window, opts: &opts };
    let out = dir.path().join("rollouts.jsonl");
    let file = std::fs::File::create(&out).unwrap();
    offline::generate(&mut backend, &job, offline::jsonl_sink(BufWriter::new(file)), |_| {}).unwrap();

    let text = std::fs::read_to_string(&out).unwrap();
    let first: RolloutRecord = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let s = first.settings.expect("the record carries its settings");
    assert_eq!((s.env, s.difficulty, s.max_new_tokens, s.seed), (EnvId::Arith, 102, 24, seed));
    assert_eq!((s.temperature, s.data, s.dataset), (0.7, None, None));

    // `validator check --model M --rollouts F --seed S`: no --difficulty.
    let mut check = validator::check::CheckOptions::new(model.clone(), out, seed);
    check.threads = Some(1);
    let mut report = Vec::new();
    let summary = validator::check::run_check(&check, &mut report).unwrap();
    let report = String::from_utf8(report).unwrap();
    assert_eq!((summary.accepted, summary.rejected), (4, 0), "{report}");
}
