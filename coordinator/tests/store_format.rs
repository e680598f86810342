//! The store's format version: a new database records it; a database of
//! another version, or one from before versions whose records this build
//! cannot decode, is refused when it is opened, with a typed error that
//! says what to do. Before: it opened, and the first read of an old record
//! failed as a generic "corrupt stored value" (at startup, or mid-run).

use std::path::Path;

use coordinator::store::{FORMAT_KEY, FORMAT_VERSION, Found, Store, StoreError};
use redb::{Database, TableDefinition};

const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");
const VERDICTS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("verdicts");

/// A database as another build left it: `meta` entries and verdict values.
fn write_raw(path: &Path, meta: &[(&str, &[u8])], verdicts: &[&[u8]]) {
    let db = Database::create(path).unwrap();
    let tx = db.begin_write().unwrap();
    {
        let mut m = tx.open_table(META).unwrap();
        for (k, v) in meta {
            m.insert(*k, *v).unwrap();
        }
        let mut t = tx.open_table(VERDICTS).unwrap();
        for (i, v) in verdicts.iter().enumerate() {
            t.insert([i as u8; 72].as_slice(), *v).unwrap();
        }
    }
    tx.commit().unwrap();
}

fn version(store: &Store) -> Option<u32> {
    store.meta(FORMAT_KEY).unwrap().map(|v| u32::from_le_bytes(v.try_into().unwrap()))
}

#[test]
fn a_new_store_records_its_format_and_opens_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.redb");
    let store = Store::open(&path).unwrap();
    assert_eq!(version(&store), Some(FORMAT_VERSION));
    drop(store);
    assert_eq!(version(&Store::open(&path).unwrap()), Some(FORMAT_VERSION));
}

#[test]
fn another_format_version_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.redb");
    write_raw(&path, &[("master_secret", &[7; 32]), (FORMAT_KEY, &(FORMAT_VERSION + 1).to_le_bytes())], &[]);
    let e = Store::open(&path).unwrap_err();
    assert!(
        matches!(&e, StoreError::Format { found: Found::Version(v), path: p } if *v == FORMAT_VERSION + 1 && *p == path),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("newer build") && msg.contains("move the data folder aside"), "{msg}");
    // Refused without a change: the stored version is still there.
    let db = Database::open(&path).unwrap();
    let tx = db.begin_read().unwrap();
    let v = tx.open_table(META).unwrap().get(FORMAT_KEY).unwrap().unwrap().value().to_vec();
    assert_eq!(v, (FORMAT_VERSION + 1).to_le_bytes());
}

#[test]
fn an_unversioned_store_that_does_not_decode_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.redb");
    // A verdict in an encoding this build does not read (e.g. before signed bodies named their network).
    write_raw(&path, &[("master_secret", &[7; 32])], &[&[0xff; 3]]);
    let e = Store::open(&path).unwrap_err();
    assert!(matches!(&e, StoreError::Format { found: Found::Unreadable(t), .. } if t == "verdicts"), "{e:?}");
    assert!(e.to_string().contains("before store format versions"), "{e}");
}

#[test]
fn an_unversioned_store_whose_records_decode_is_stamped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.redb");
    // The previous build's database: tables as this build writes them, no version.
    write_raw(&path, &[("master_secret", &[7; 32])], &[]);
    let store = Store::open(&path).unwrap();
    assert_eq!(version(&store), Some(FORMAT_VERSION));
    assert_eq!(store.meta("master_secret").unwrap(), Some(vec![7; 32]));
}
