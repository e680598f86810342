//! Checkpoints, deltas and signed weights documents on object storage
//! (issue 21): a coordinator configured with an archive writes every relayed
//! checkpoint's full file and delta (content-addressed) and every signed
//! weights document to the store, idempotently; a path whose steps the store
//! holds carries the store's public URL; relay retention deletes only what
//! the store holds. Real `object_store` local-filesystem backend, real files.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use coordinator::archive::{Archive, ArchiveError};
use coordinator::node::{self, Config, ConfigError, Node};
use coordinator::relay::{self, Entry};
use coordinator::server::Shared;
use coordinator::testing::{publication_id as id, store_publication};
use coordinator::upkeep;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::wire::{WeightsDoc, store_key, store_weights_key};

const GENESIS: ContentId = ContentId([1; 32]);
const URL: &str = "https://cdn.example/tributary";

fn config(dir: &Path) -> Config {
    let mut cfg = Config::dev(dir.join("data"));
    cfg.window_ms = 600_000;
    cfg.archive = Some("objects".into());
    cfg.store_url = Some(URL.into());
    // Retention runs when the test says (below), not on the node's timer.
    cfg.keep_checkpoints = 0;
    cfg
}

fn objects(dir: &Path) -> std::path::PathBuf {
    dir.join("data/objects")
}

/// Publication `i` for window `i`, in force from the next
/// ([`store_publication`]: a full file of 4 KiB, with a base a delta of 100 bytes).
fn publish(node: &Node, i: u8, base: Option<u8>) -> Entry {
    store_publication(&node.shared, i, base, u64::from(i), u64::from(i) + 1)
}

async fn until(mut f: impl FnMut() -> bool) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("timed out")
}

fn stored_bytes(dir: &Path, key: &str) -> Option<Vec<u8>> {
    std::fs::read(objects(dir).join(key)).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_deltas_and_weights_documents_reach_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let node = node::start(&cfg, GENESIS).await.unwrap();
    let sh: Arc<Shared> = node.shared.clone();
    let entries = [1, 2, 3].map(|i| publish(&node, i, (i > 1).then(|| i - 1)));
    // A signed weights document, as the signer stores it.
    let doc = WeightsDoc::sign(sh.core().weights(3, sh.key.public()), &sh.key, &sh.network());
    assert!(sh.store.put_weights_doc(&doc).unwrap());

    // Written on the new-checkpoint wake-up, not a minute later.
    until(|| entries.iter().all(|e| sh.relay.is_stored(&e.id))).await;
    for e in &entries {
        let full = stored_bytes(dir.path(), &store_key(&e.id, None, &e.full_hash)).expect("full file stored");
        assert_eq!(full, std::fs::read(sh.relay.full_path(&e.id)).unwrap());
        if let Some((base, len, hash)) = e.delta {
            let key = store_key(&e.id, Some(&base), &hash);
            assert!(key.starts_with("deltas/"), "{key}");
            let d = stored_bytes(dir.path(), &key).expect("delta stored");
            assert_eq!((d.len() as u64, *blake3::hash(&d).as_bytes()), (len, hash));
        }
    }
    // The weights document, verifiable by a reader with only the store and the coordinator's key.
    let a = Archive::open(objects(dir.path()).to_str().unwrap()).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some(d) = a.weights(3).await.unwrap() {
                break d;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("weights document stored");
    assert_eq!(got, doc);
    got.verify(&sh.network()).unwrap();
    assert!(objects(dir.path()).join(store_weights_key(3)).is_file());

    // Paths the store holds carry its URL; the relay serves the same steps.
    let p = sh.relay.path(Some(id(1)), None).unwrap();
    assert_eq!(p.steps.iter().map(|s| s.id).collect::<Vec<_>>(), [id(2), id(3)]);
    assert_eq!(p.store_url.as_deref(), Some(URL));
    let p = sh.relay.path(None, Some(id(2))).unwrap();
    assert_eq!(p.store_url.as_deref(), Some(URL));
    assert!(stored_bytes(dir.path(), &p.steps[0].store_key()).is_some());

    // Idempotent: a second pass writes nothing, and a writer that does not
    // know what is stored (a restarted coordinator) finds each object by its
    // key and size and leaves it.
    assert!(upkeep::store_checkpoints(&sh, &a).await.unwrap().is_empty());
    let key = store_key(&id(3), None, &entries[2].full_hash);
    let mtime = || std::fs::metadata(objects(dir.path()).join(&key)).unwrap().modified().unwrap();
    let before = mtime();
    assert!(!a.put_file(&key, &sh.relay.full_path(&id(3)), 4096, &entries[2].full_hash).await.unwrap());
    assert_eq!(mtime(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_is_not_its_content_address_is_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let a = Archive::local(dir.path()).unwrap();
    let file = dir.path().join("payload");
    std::fs::write(&file, vec![7u8; 20 << 20]).unwrap();
    let hash = *blake3::hash(&std::fs::read(&file).unwrap()).as_bytes();
    // Streamed in parts (20 MiB, parts of 8) and written once.
    assert!(a.put_file("checkpoints/x.gguf", &file, 20 << 20, &hash).await.unwrap());
    assert!(!a.put_file("checkpoints/x.gguf", &file, 20 << 20, &hash).await.unwrap());
    assert_eq!(std::fs::read(dir.path().join("checkpoints/x.gguf")).unwrap(), std::fs::read(&file).unwrap());
    // Another hash, a shorter or a longer announced length: refused, nothing at the key.
    for (len, h) in [(20 << 20, [0u8; 32]), ((20 << 20) - 1, hash), ((20 << 20) + 1, hash)] {
        let r = a.put_file("checkpoints/y.gguf", &file, len, &h).await;
        assert!(matches!(r, Err(ArchiveError::Mismatch { .. })), "{len}: {r:?}");
        assert!(!a.holds("checkpoints/y.gguf", len).await.unwrap());
        assert!(!dir.path().join("checkpoints/y.gguf").exists());
    }
    // A missing local file is a typed error.
    let r = a.put_file("checkpoints/z.gguf", &dir.path().join("nope"), 1, &hash).await;
    assert!(matches!(r, Err(ArchiveError::Io { .. })), "{r:?}");
}

/// Fails without the gate in `Relay::past_retention`: retention deleted the
/// relay's only copy of checkpoints the store never received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_retention_deletes_only_what_the_store_holds() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    // The store cannot take checkpoints yet: `checkpoints` is a file, not a folder.
    std::fs::create_dir_all(objects(dir.path())).unwrap();
    std::fs::write(objects(dir.path()).join("checkpoints"), b"in the way").unwrap();
    let node = node::start(&cfg, GENESIS).await.unwrap();
    let sh = node.shared.clone();
    for i in 1..=5u8 {
        publish(&node, i, (i > 1).then(|| i - 1));
    }
    let now = sh.core().schedule().opens_at(6) + 1_000;
    let sh2 = sh.clone();
    let retention = move || upkeep::apply_retention(&sh2, 1, now).unwrap();
    // Give the store task time to try (and fail) on every entry.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!sh.relay.is_stored(&id(1)));
    assert_eq!(tokio::task::spawn_blocking(retention.clone()).await.unwrap(), Vec::<ContentId>::new());
    assert_eq!(sh.relay.entries().len(), 5);
    assert!(sh.relay.full_path(&id(1)).is_file());
    // The path has no store URL while the store lacks its steps.
    assert_eq!(sh.relay.path(None, None).unwrap().store_url, None);

    // The store comes back: everything is written, then retention deletes
    // the old local copies, which stay in the store.
    std::fs::remove_file(objects(dir.path()).join("checkpoints")).unwrap();
    until(|| (1..=5).all(|i| sh.relay.is_stored(&id(i)))).await;
    let mut gone = tokio::task::spawn_blocking(retention).await.unwrap();
    gone.sort();
    assert!(!gone.is_empty());
    for g in &gone {
        assert!(!sh.relay.full_path(g).exists());
        let hash = relay::hash_file(&objects(dir.path()).join(format!("checkpoints/{g}.gguf"))).unwrap();
        assert_eq!(hash.0, 4096, "{g} stays in the store");
    }
}

#[test]
fn a_store_url_needs_an_archive_and_an_http_scheme() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    node::check_store_url(&cfg).unwrap();
    for bad in ["ftp://x/y", "https://", "cdn.example", "https://a b"] {
        cfg.store_url = Some(bad.into());
        assert_eq!(node::check_store_url(&cfg), Err(ConfigError::StoreUrl(bad.into())), "{bad}");
    }
    cfg.store_url = Some(URL.into());
    cfg.archive = None;
    assert!(matches!(node::check_store_url(&cfg), Err(ConfigError::StoreUrl(_))));
}

/// A restarted coordinator knows nothing of what the store holds: it finds
/// every checkpoint there by key and size, rewrites none, and until then
/// neither names the store's URL nor lets retention delete anything.
#[test]
fn a_restarted_coordinator_finds_what_the_store_holds_and_rewrites_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let start = || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        // The previous coordinator's writer thread lets go of the database shortly after its runtime stops.
        for attempt in 0.. {
            match rt.block_on(node::start(&cfg, GENESIS)) {
                Ok(n) => return (rt, n),
                Err(_) if attempt < 50 => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => panic!("start: {e:#}"),
            }
        }
        unreachable!()
    };
    let (rt, node) = start();
    let entries: Vec<Entry> = (1..=3u8).map(|i| publish(&node, i, (i > 1).then(|| i - 1))).collect();
    let sh = node.shared.clone();
    rt.block_on(until(|| entries.iter().all(|e| sh.relay.is_stored(&e.id))));
    let keys: Vec<String> = entries.iter().map(|e| store_key(&e.id, None, &e.full_hash)).collect();
    let mtimes = |keys: &[String]| -> Vec<std::time::SystemTime> {
        keys.iter().map(|k| std::fs::metadata(objects(dir.path()).join(k)).unwrap().modified().unwrap()).collect()
    };
    let before = mtimes(&keys);
    drop(sh);
    drop(node);
    drop(rt);

    // The store is out of reach at the restart: nothing is known to be stored.
    let blocker = objects(dir.path()).join("deltas.blocked");
    std::fs::rename(objects(dir.path()).join("deltas"), &blocker).unwrap();
    std::fs::write(objects(dir.path()).join("deltas"), b"in the way").unwrap();
    let (rt, node) = start();
    let sh = node.shared.clone();
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(500)).await });
    assert!(!sh.relay.is_stored(&id(2)), "a delta the store cannot show is not taken as stored");
    // A miner asking for the latest is held at the latest the store shows
    // (1, a full file it holds); one whose window needs 3 asks for it by id
    // and gets the relay's deltas.
    let p = sh.relay.path(Some(id(1)), None).unwrap();
    assert!(p.target == id(1) && p.steps.is_empty(), "{p:?}");
    let p = sh.relay.path(Some(id(1)), Some(id(3))).unwrap();
    assert_eq!((p.steps.len(), p.store_url), (2, None));
    let now = sh.core().schedule().opens_at(5) + 1_000;
    // 1 (a full file, found) may go; 2, whose delta the store does not show, stays.
    assert_eq!(upkeep::apply_retention(&sh, 1, now).unwrap(), vec![id(1)]);
    assert!(sh.relay.full_path(&id(2)).is_file());

    // Reachable again: found by key and size, not rewritten.
    std::fs::remove_file(objects(dir.path()).join("deltas")).unwrap();
    std::fs::rename(&blocker, objects(dir.path()).join("deltas")).unwrap();
    rt.block_on(until(|| entries[1..].iter().all(|e| sh.relay.is_stored(&e.id))));
    assert_eq!(mtimes(&keys), before);
    assert_eq!(sh.relay.path(Some(id(1)), None).unwrap().store_url.as_deref(), Some(URL));
}
