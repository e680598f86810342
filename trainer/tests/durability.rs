//! Stop/resume is exact, and publication never gives two checkpoints for one window.

use tch::Device;
use trainer::publish::{PublishError, Publisher};
use trainer::state;
use trainer::train::{Sample, TrainConfig, Trainer};
use tributary_assets as assets;
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::delta;
use tributary_protocol::identity::Keypair;
use tributary_protocol::tiny;
use tributary_protocol::wire::{CheckpointKind, NetworkId};

/// The network the publications are signed for.
const NET: NetworkId = NetworkId([5; 32]);

fn tiny_ckpt(dir: &std::path::Path) -> Checkpoint {
    let src = Checkpoint::open(&assets::smollm2_q4_1()).expect("SmolLM2 GGUF (run scripts/setup.sh)");
    let path = dir.join("tiny.gguf");
    tiny::write_tiny(0, &src, &path).unwrap();
    Checkpoint::open(&path).unwrap()
}

fn samples() -> Vec<Sample> {
    let mk = |seed: u32, adv: f32| {
        let tokens: Vec<u32> = (0..12).map(|i| (seed * 7919 + i * 104_729) % 49152).collect();
        Sample {
            tokens,
            prompt_len: 5,
            temperature: 1.0,
            old_logprobs: vec![-10.5; 7],
            advantage: adv,
            reward: adv.max(0.0),
        }
    };
    vec![mk(1, 1.0), mk(2, -1.0), mk(3, 0.5), mk(4, -0.5)]
}

#[test]
fn resume_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let base = tiny_ckpt(dir.path());
    let cfg = TrainConfig { lr: 1e-3, warmup_steps: 2, ..TrainConfig::default() };
    let mut a = Trainer::from_checkpoint(&base, Device::Cpu, cfg).unwrap();
    assert!(state::load(&dir.path().join("state"), Device::Cpu, cfg).unwrap().is_none());
    a.step(&samples()).unwrap();
    state::save(&dir.path().join("state"), &a).unwrap();
    let mut b = state::load(&dir.path().join("state"), Device::Cpu, cfg).unwrap().unwrap();
    assert_eq!(b.steps(), 1);
    assert_eq!(a.export_checkpoint(&base).unwrap(), b.export_checkpoint(&base).unwrap());
    // The next step (warm-up lr, Adam moments) is identical.
    let sa = a.step(&samples()).unwrap();
    let sb = b.step(&samples()).unwrap();
    assert_eq!(sa, sb);
    assert_eq!(a.export_checkpoint(&base).unwrap(), b.export_checkpoint(&base).unwrap());
    // Saving again replaces the files.
    state::save(&dir.path().join("state"), &b).unwrap();
    let names: Vec<String> = std::fs::read_dir(dir.path().join("state"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.contains(&"weights-2.safetensors".to_owned()));
}

#[test]
fn one_checkpoint_per_window_full_then_deltas() {
    let dir = tempfile::tempdir().unwrap();
    let base = tiny_ckpt(dir.path());
    let key = Keypair::from_seed([7; 32]);
    let cfg = TrainConfig { lr: 1e-3, warmup_steps: 1, ..TrainConfig::default() };
    let mut tr = Trainer::from_checkpoint(&base, Device::Cpu, cfg).unwrap();
    let pdir = dir.path().join("pub");
    let mut p = Publisher::open(&pdir, Keypair::from_seed([7; 32]), NET, 3).unwrap();

    let first = p.publish(10, base.bytes().to_vec()).unwrap();
    assert_eq!(first.announcement.body.kind, CheckpointKind::Full);
    first.announcement.verify(&NET).unwrap();
    assert_eq!(first.announcement.body.trainer, key.public());

    tr.step(&samples()).unwrap();
    let w11 = tr.export_checkpoint(&base).unwrap();
    let second = p.publish(11, w11.clone()).unwrap();
    second.announcement.verify(&NET).unwrap();
    assert_eq!(second.announcement.body.kind, CheckpointKind::Delta { base: base.content_id() });
    let payload = std::fs::read(&second.payload).unwrap();
    assert_eq!(payload.len() as u64, second.announcement.body.len);
    assert_eq!(blake3::hash(&payload).as_bytes(), &second.announcement.body.payload_hash);
    // A miner holding the base reconstructs the announced checkpoint.
    let rebuilt = delta::apply_to_copy(&payload, base.bytes()).unwrap();
    assert_eq!(rebuilt, w11);
    assert_eq!(Checkpoint::from_bytes(rebuilt).unwrap().content_id(), second.announcement.body.id);

    // Same window, same checkpoint: idempotent. Different checkpoint: refused.
    let again = p.publish(11, w11.clone()).unwrap();
    assert_eq!(again.announcement, second.announcement);
    tr.step(&samples()).unwrap();
    let w12 = tr.export_checkpoint(&base).unwrap();
    assert!(matches!(p.publish(11, w12.clone()), Err(PublishError::WindowAlreadyPublished { .. })));
    assert!(matches!(p.publish(9, w12.clone()), Err(PublishError::WindowRegressed { .. })));
    // ... also after a restart.
    drop(p);
    let mut p = Publisher::open(&pdir, Keypair::from_seed([7; 32]), NET, 3).unwrap();
    assert_eq!(p.records().len(), 2);
    assert!(matches!(p.publish(11, w12.clone()), Err(PublishError::WindowAlreadyPublished { .. })));

    // Delta chain, then a full one every 3 publications.
    let third = p.publish(12, w12.clone()).unwrap();
    assert!(matches!(third.announcement.body.kind, CheckpointKind::Delta { .. }));
    tr.step(&samples()).unwrap();
    let fourth = p.publish(13, tr.export_checkpoint(&base).unwrap()).unwrap();
    assert_eq!(fourth.announcement.body.kind, CheckpointKind::Full);
    assert_eq!(p.published_ids().len(), 4);
}

#[test]
fn retention_keeps_the_last_publications_files_and_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let base = tiny_ckpt(dir.path());
    let cfg = TrainConfig { lr: 1e-3, warmup_steps: 1, ..TrainConfig::default() };
    let mut tr = Trainer::from_checkpoint(&base, Device::Cpu, cfg).unwrap();
    let pdir = dir.path().join("pub");
    let mut p = Publisher::open(&pdir, Keypair::from_seed([7; 32]), NET, 2).unwrap();
    p.set_retention(2);
    let files = |sub: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(pdir.join(sub))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let mut published = vec![p.publish(20, base.bytes().to_vec()).unwrap()];
    for w in 21..25 {
        tr.step(&samples()).unwrap();
        published.push(p.publish(w, tr.export_checkpoint(&base).unwrap()).unwrap());
    }
    // The same weights again (an lr = 0 window): one file, named by two records.
    published.push(p.publish(25, std::fs::read(&published[4].checkpoint).unwrap()).unwrap());
    assert_eq!(p.records().len(), 6, "the record keeps every publication");
    assert_eq!(files("windows"), ["24", "25"]);
    let kept: Vec<String> =
        published[4..].iter().map(|x| x.checkpoint.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(kept[0], kept[1]);
    assert_eq!(files("checkpoints"), [kept[0].clone()]);
    for old in &published[..4] {
        assert!(!old.checkpoint.exists() && !old.payload.exists(), "{old:?}");
    }
    // The next delta's base is still there: the chain goes on.
    tr.step(&samples()).unwrap();
    let next = p.publish(26, tr.export_checkpoint(&base).unwrap()).unwrap();
    assert!(matches!(next.announcement.body.kind, CheckpointKind::Delta { .. } | CheckpointKind::Full));
    assert_eq!(files("windows"), ["25", "26"]);
    // 0 keeps everything.
    let mut all = Publisher::open(&dir.path().join("all"), Keypair::from_seed([7; 32]), NET, 2).unwrap();
    all.set_retention(0);
    for w in 0..4 {
        all.publish(w, base.bytes().to_vec()).unwrap();
    }
    assert_eq!(std::fs::read_dir(dir.path().join("all/windows")).unwrap().count(), 4);
}
