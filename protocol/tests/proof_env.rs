//! Task environments against the real GSM8K file and across runs.

use std::path::Path;

use tributary_protocol::env::*;
use tributary_protocol::prf::Seed;

#[test]
fn gsm8k_file_loads_and_gold_solutions_score_one() {
    let dir = tributary_assets::gsm8k_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .expect("shared/data/gsm8k beside the repository (or TRIBUTARY_GSM8K_DIR)");
    let path = &dir.join("test.jsonl");
    let env = Gsm8kEnv::load(path).unwrap();
    assert_eq!(env.len(), 1319);
    let raw = std::fs::read_to_string(path).unwrap();
    // Every reference solution, used as a completion, earns reward 1.
    let mut ok = 0;
    for (item, line) in env.items().iter().zip(raw.lines()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let solution = v["answer"].as_str().unwrap();
        let task = Task {
            env: EnvId::Gsm8k,
            id: 0,
            prompt: item.question.clone(),
            answer: TaskAnswer::Number(item.answer.clone()),
        };
        if task.answer.reward(solution) == 1.0 {
            ok += 1;
        }
        // Stripping the marker still finds the last number in most solutions; a wrong number never scores.
        assert_eq!(task.answer.reward("Answer: 123456789"), if item.answer == "123456789" { 1.0 } else { 0.0 });
    }
    assert_eq!(ok, env.len());
    let e = Environment::Gsm8k(env);
    let t = e.task(task_seed(&Seed([1; 32]), &[2; 32], 3));
    assert_eq!(t, e.task(t.id));
    assert!(e.prompt_text(&t).contains(&t.prompt));
}

#[test]
fn procedural_tasks_are_pinned() {
    // Pinned prompts: a change here changes every miner's task (a protocol bump).
    let seed = task_seed(&Seed([1; 32]), &[2; 32], 0);
    let a = ArithEnv::new(3).task(seed);
    let s = SatEnv::default().task(seed);
    let again = (ArithEnv::new(3).task(seed), SatEnv::default().task(seed));
    assert_eq!((a.clone(), s.clone()), again);
    let digest = blake3::hash(format!("{}\n{}\n{:?}", a.prompt, s.prompt, a.answer).as_bytes());
    assert_eq!(digest.to_hex().as_str(), PINNED);
}

const PINNED: &str = "a0dcea6e0a433c743ca8f30ef2bea8e48549c78856cc5783b7eca42675eb122a";
