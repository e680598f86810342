//! Operator commands on a coordinator's data folder: ban and unban a miner,
//! change the window length, inspect the database; and helpers that need no
//! database: `keygen` and `pubkey` (role keys), `fingerprint`,
//! `install-cert` (an operator's certificate, e.g. signed by the network's
//! CA) and `check-config`.
//!
//! Overrides live in their own redb file, `admin.redb`, next to
//! `coordinator.redb`. A command that edits the data folder first opens
//! `coordinator.redb`, which a running coordinator holds locked, so it
//! notices a live coordinator instead of being silently ignored. At start the
//! coordinator reads the overrides back ([`schedule`], [`apply_overrides`]).
//!
//! - **Bans.** `ban` bans a miner from the current window for N windows;
//!   `unban` lifts every ban in force: manual ones, and those from failures in
//!   windows that already have a verdict (a failure in a later window bans
//!   again). Both work on a running coordinator too: it listens on a Unix
//!   socket in its data folder ([`ADMIN_SOCKET`], mode 0600: only the
//!   coordinator's user, and root, may connect), applies the change to its
//!   live state at once and stores it in `admin.redb` ([`serve_live`]). The
//!   command picks the path itself: offline if the database opens, else the
//!   socket.
//! - **Window length.** The window clock is `genesis + W·length`, so editing
//!   `window_ms` alone would renumber windows (possibly reopening windows
//!   whose challenges were revealed). `window-length` re-anchors the clock so
//!   that window `W+1` (W the current window) starts at once with the new
//!   length and every earlier window stays closed. The coordinator records the
//!   length it runs with and refuses to start with another one. It needs the
//!   coordinator stopped.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use tributary_net::now_ms;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::window::{Schedule, ScheduleError, WindowId};

use crate::core::Core;
use crate::server::Shared;
use crate::store::{Store, StoreError};

/// File name of the live admin socket (Unix domain) in the data folder.
pub const ADMIN_SOCKET: &str = "admin.sock";

/// File name of the overrides database in the data folder.
pub const ADMIN_DB: &str = "admin.redb";

const SCHEDULE: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("schedule");
/// miner key → postcard(BanOverride).
const BANS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("bans");
/// validator key → refutations of its evidence an operator cleared ([`crate::bans`]).
const VALIDATOR_CLEARS: TableDefinition<'_, &[u8], u64> = TableDefinition::new("validator_clears");

/// Admin failures.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The coordinator is running on this data folder.
    #[error("the coordinator is running on {0} (stop it first: these commands edit its database)")]
    Running(PathBuf),
    /// No database in the data folder.
    #[error("no coordinator database in {0}")]
    NoDatabase(PathBuf),
    /// The database failed.
    #[error("database: {0}")]
    Db(Box<redb::Error>),
    /// The coordinator's store failed.
    #[error("store: {0}")]
    Store(Box<StoreError>),
    /// A stored value did not decode.
    #[error("corrupt {0} in admin.redb")]
    Corrupt(&'static str),
    /// The window length cannot be determined.
    #[error("window length unknown: give --config FILE (the coordinator's) or --current-window-ms")]
    UnknownLength,
    /// The configured window length differs from the one the network runs.
    #[error(
        "the network's window length is {recorded} ms but the configuration says {configured} ms; \
         to change it run `coordinator window-length --data DIR --window-ms {configured}` with the coordinator stopped, \
         or set window_ms = {recorded}"
    )]
    LengthChanged {
        /// What the data folder records.
        recorded: u64,
        /// What the configuration asks.
        configured: u64,
    },
    /// A bad schedule.
    #[error("schedule: {0}")]
    Schedule(#[from] ScheduleError),
    /// A bad argument.
    #[error("{0}")]
    Invalid(String),
    /// The running coordinator could not be reached, or refused, on its admin socket.
    #[error("live coordinator on {dir}: {detail}")]
    Live {
        /// The data folder.
        dir: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// Reading the configuration failed.
    #[error("config {path}: {detail}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

impl From<StoreError> for AdminError {
    fn from(e: StoreError) -> Self {
        AdminError::Store(Box::new(e))
    }
}

macro_rules! db_from {
    ($($t:ty),*) => {$(
        impl From<$t> for AdminError {
            fn from(e: $t) -> Self { AdminError::Db(Box::new(e.into())) }
        }
    )*};
}
db_from!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// The window clock's anchor as the network runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anchor {
    /// Genesis instant (ms since the Unix epoch) of the current length.
    pub genesis_ms: u64,
    /// Window length in milliseconds.
    pub window_ms: u64,
}

/// An operator's override of one miner's bans.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BanOverride {
    /// Banned through this window (inclusive) by `coordinator ban`.
    pub manual_through: Option<WindowId>,
    /// Failures in windows before this one are forgiven (`coordinator unban`).
    pub forgive_before: WindowId,
}

/// The overrides database.
#[derive(Debug)]
pub struct Admin {
    db: Database,
}

impl Admin {
    /// Opens (or creates) `admin.redb` in `data_dir`.
    pub fn open(data_dir: &Path) -> Result<Self, AdminError> {
        let db = Database::create(data_dir.join(ADMIN_DB))?;
        let tx = db.begin_write()?;
        {
            tx.open_table(SCHEDULE)?;
            tx.open_table(BANS)?;
            tx.open_table(VALIDATOR_CLEARS)?;
        }
        tx.commit()?;
        Ok(Self { db })
    }

    /// The recorded anchor, if any.
    pub fn anchor(&self) -> Result<Option<Anchor>, AdminError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(SCHEDULE)?;
        t.get("anchor")?.map(|v| postcard::from_bytes(v.value()).map_err(|_| AdminError::Corrupt("anchor"))).transpose()
    }

    /// Records the anchor.
    pub fn set_anchor(&self, a: Anchor) -> Result<(), AdminError> {
        let v = postcard::to_stdvec(&a).map_err(|_| AdminError::Corrupt("anchor"))?;
        let tx = self.db.begin_write()?;
        tx.open_table(SCHEDULE)?.insert("anchor", v.as_slice())?;
        tx.commit()?;
        Ok(())
    }

    /// Every miner's override.
    pub fn overrides(&self) -> Result<Vec<(PublicKey, BanOverride)>, AdminError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(BANS)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            let key: [u8; 32] = k.value().try_into().map_err(|_| AdminError::Corrupt("ban key"))?;
            let o = postcard::from_bytes(v.value()).map_err(|_| AdminError::Corrupt("ban"))?;
            out.push((PublicKey(key), o));
        }
        Ok(out)
    }

    /// One miner's override.
    pub fn override_of(&self, miner: &PublicKey) -> Result<BanOverride, AdminError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(BANS)?;
        t.get(miner.as_bytes().as_slice())?
            .map(|v| postcard::from_bytes(v.value()).map_err(|_| AdminError::Corrupt("ban")))
            .transpose()
            .map(Option::unwrap_or_default)
    }

    /// Every validator clear: key → refutations cleared.
    pub fn validator_clears(&self) -> Result<Vec<(PublicKey, u64)>, AdminError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(VALIDATOR_CLEARS)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            let key: [u8; 32] = k.value().try_into().map_err(|_| AdminError::Corrupt("validator key"))?;
            out.push((PublicKey(key), v.value()));
        }
        Ok(out)
    }

    /// Records that an operator cleared `validator` with `refutations` refutations of its evidence.
    pub fn set_validator_clear(&self, validator: &PublicKey, refutations: u64) -> Result<(), AdminError> {
        let tx = self.db.begin_write()?;
        tx.open_table(VALIDATOR_CLEARS)?.insert(validator.as_bytes().as_slice(), refutations)?;
        tx.commit()?;
        Ok(())
    }

    /// Stores one miner's override.
    pub fn set_override(&self, miner: &PublicKey, o: BanOverride) -> Result<(), AdminError> {
        let v = postcard::to_stdvec(&o).map_err(|_| AdminError::Corrupt("ban"))?;
        let tx = self.db.begin_write()?;
        tx.open_table(BANS)?.insert(miner.as_bytes().as_slice(), v.as_slice())?;
        tx.commit()?;
        Ok(())
    }
}

/// The schedule a coordinator starts with: the recorded anchor (which must
/// have `window_ms`), or, on first start, `genesis_ms` with `window_ms`,
/// which is then recorded.
pub fn schedule(data_dir: &Path, genesis_ms: u64, window_ms: u64, grace_ms: u64) -> Result<Schedule, AdminError> {
    let admin = Admin::open(data_dir)?;
    let anchor = match admin.anchor()? {
        Some(a) if a.window_ms != window_ms => {
            return Err(AdminError::LengthChanged { recorded: a.window_ms, configured: window_ms });
        }
        Some(a) => a,
        None => {
            let a = Anchor { genesis_ms, window_ms };
            admin.set_anchor(a)?;
            a
        }
    };
    Ok(Schedule::new(anchor.genesis_ms, anchor.window_ms, grace_ms)?)
}

/// Applies the operators' ban overrides to a core restored from the store
/// (after its verdicts).
pub fn apply_overrides(data_dir: &Path, core: &mut Core) -> Result<(), AdminError> {
    let admin = Admin::open(data_dir)?;
    for (miner, o) in admin.overrides()? {
        apply_override(core, miner, o);
    }
    for (validator, n) in admin.validator_clears()? {
        core.restore_clear(validator, usize::try_from(n).unwrap_or(usize::MAX));
    }
    Ok(())
}

/// One miner's override on a core: banned through the later of its manual
/// ban and the bans of its failures not forgiven.
fn apply_override(core: &mut Core, miner: PublicKey, o: BanOverride) {
    let ban_windows = core.config().ban_windows;
    let derived = core
        .miners()
        .get(&miner)
        .and_then(|m| m.failures.iter().filter(|w| **w >= o.forgive_before).max().copied())
        .map(|w| w.saturating_add(ban_windows));
    core.set_banned_through(miner, derived.max(o.manual_through));
}

/// Records a manual ban of `miner` for `windows` windows from window `now`.
fn record_ban(admin: &Admin, miner: &PublicKey, now: WindowId, windows: u64) -> Result<BanOverride, AdminError> {
    if windows == 0 {
        return Err(AdminError::Invalid("--windows must be at least 1".into()));
    }
    let through = now.saturating_add(windows - 1);
    let mut o = admin.override_of(miner)?;
    o.manual_through = Some(o.manual_through.map_or(through, |t| t.max(through)));
    admin.set_override(miner, o)?;
    Ok(o)
}

/// Records an unban of `miner`: no manual ban, and every window that already
/// has a verdict on it forgiven.
fn record_unban(store: &Store, admin: &Admin, miner: &PublicKey) -> Result<BanOverride, AdminError> {
    let judged = store
        .verdicts()?
        .iter()
        .filter(|v| v.body.miner == *miner)
        .map(|v| v.body.window.saturating_add(1))
        .max()
        .unwrap_or(0);
    let o = BanOverride { manual_through: None, forgive_before: judged };
    admin.set_override(miner, o)?;
    Ok(o)
}

/// A request on the live admin socket: one JSON line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
enum LiveRequest {
    /// `coordinator ban`.
    Ban {
        /// The miner's key (hex).
        miner: String,
        /// Windows from the current one.
        windows: u64,
    },
    /// `coordinator unban`.
    Unban {
        /// The miner's key (hex).
        miner: String,
    },
    /// `coordinator clear-validator`.
    ClearValidator {
        /// The validator's key (hex).
        validator: String,
    },
}

/// Most bytes of a live request.
const LIVE_REQUEST_LIMIT: u64 = 4096;

/// Carries out a live request on the running coordinator: the override is
/// stored in `admin.redb` (so a restart keeps it) and applied to the live
/// core at once. Returns the `key=value` lines the command prints.
fn live_apply(data_dir: &Path, shared: &Shared, req: &LiveRequest) -> Result<Vec<String>, AdminError> {
    let admin = Admin::open(data_dir)?;
    match req {
        LiveRequest::Ban { miner, windows } => {
            let miner = parse_key(miner)?;
            let now = shared.core().schedule().window_at(now_ms()).unwrap_or(0);
            let o = record_ban(&admin, &miner, now, *windows)?;
            apply_override(&mut shared.core(), miner, o);
            shared.note_admin_change();
            tracing::info!(%miner, window = now, through = ?o.manual_through, "operator ban (live)");
            Ok(vec![
                format!("banned={miner}"),
                format!("window={now}"),
                format!("through={}", o.manual_through.unwrap_or(now)),
            ])
        }
        LiveRequest::ClearValidator { validator } => {
            let validator = parse_key(validator)?;
            let was = shared.core().is_flagged(&validator);
            let n = shared.core().clear_validator(&validator);
            shared.note_admin_change();
            admin.set_validator_clear(&validator, n as u64)?;
            tracing::info!(%validator, refutations = n, was_flagged = was, "operator cleared a validator (live)");
            Ok(vec![format!("cleared={validator}"), format!("refutations={n}"), format!("was_flagged={was}")])
        }
        LiveRequest::Unban { miner } => {
            let miner = parse_key(miner)?;
            let now = shared.core().schedule().window_at(now_ms()).unwrap_or(0);
            let o = record_unban(&shared.store, &admin, &miner)?;
            apply_override(&mut shared.core(), miner, o);
            shared.note_admin_change();
            tracing::info!(%miner, window = now, forgiven_before = o.forgive_before, "operator unban (live)");
            Ok(vec![
                format!("unbanned={miner}"),
                format!("window={now}"),
                format!("forgiven_before={}", o.forgive_before),
            ])
        }
    }
}

/// The live admin listener of a running coordinator; the socket file is
/// removed when it is dropped.
#[derive(Debug)]
pub struct LiveAdmin {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl LiveAdmin {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for LiveAdmin {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Serves `ban`/`unban` for a running coordinator on `data_dir/admin.sock`
/// (a Unix socket, mode 0600). Requests are handled one at a time. Call it
/// after [`crate::node::start`]: the coordinator then holds the database
/// lock, so a socket file left by a crashed predecessor can be replaced.
#[cfg(unix)]
pub fn serve_live(data_dir: &Path, shared: Arc<Shared>) -> std::io::Result<LiveAdmin> {
    use std::os::unix::fs::PermissionsExt;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let path = data_dir.join(ADMIN_SOCKET);
    match std::fs::remove_file(&path) {
        Ok(()) => tracing::info!(path = %path.display(), "replaced a stale admin socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = tokio::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let dir = data_dir.to_path_buf();
    let task = tokio::spawn(async move {
        loop {
            let mut stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("admin socket: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (read, mut write) = stream.split();
            let mut line = String::new();
            let mut limited = tokio::io::BufReader::new(read.take(LIVE_REQUEST_LIMIT));
            let got = tokio::time::timeout(std::time::Duration::from_secs(5), limited.read_line(&mut line)).await;
            let reply = match got {
                Ok(Ok(_)) => match serde_json::from_str::<LiveRequest>(line.trim()) {
                    Ok(req) => {
                        let (dir, shared) = (dir.clone(), shared.clone());
                        match tokio::task::spawn_blocking(move || live_apply(&dir, &shared, &req)).await {
                            Ok(Ok(lines)) => lines,
                            Ok(Err(e)) => vec![format!("error={e}")],
                            Err(e) => vec![format!("error=admin task failed: {e}")],
                        }
                    }
                    Err(e) => vec![format!("error=bad request: {e}")],
                },
                Ok(Err(e)) => vec![format!("error=reading the request: {e}")],
                Err(_) => vec!["error=no request within 5 s".to_string()],
            };
            let mut text = reply.join("\n");
            text.push('\n');
            let _ = write.write_all(text.as_bytes()).await;
            let _ = write.shutdown().await;
        }
    });
    Ok(LiveAdmin { path, task })
}

/// Sends `req` to the running coordinator of `data_dir` and writes its
/// answer's lines to `out`, then `applied=live`.
#[cfg(unix)]
fn live_request(data_dir: &Path, req: &LiveRequest, out: &mut dyn std::io::Write) -> Result<(), AdminError> {
    use std::io::{Read, Write};
    let live = |detail: String| AdminError::Live { dir: data_dir.into(), detail };
    let path = data_dir.join(ADMIN_SOCKET);
    let mut s = std::os::unix::net::UnixStream::connect(&path).map_err(|e| {
        live(format!(
            "its database is in use but its admin socket {} does not answer ({e}); run this command as the \
             coordinator's user (or root), or stop the coordinator and retry",
            path.display()
        ))
    })?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).map_err(|e| live(e.to_string()))?;
    let mut body = serde_json::to_string(req).map_err(|e| live(e.to_string()))?;
    body.push('\n');
    s.write_all(body.as_bytes()).map_err(|e| live(format!("sending: {e}")))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| live(format!("reading the answer: {e}")))?;
    if let Some(err) = answer.lines().find_map(|l| l.strip_prefix("error=")) {
        return Err(live(err.to_string()));
    }
    if answer.trim().is_empty() {
        return Err(live("empty answer".into()));
    }
    for l in answer.lines() {
        writeln!(out, "{l}").map_err(|e| AdminError::Invalid(format!("stdout: {e}")))?;
    }
    writeln!(out, "applied=live").map_err(|e| AdminError::Invalid(format!("stdout: {e}")))?;
    Ok(())
}

#[cfg(not(unix))]
fn live_request(data_dir: &Path, _req: &LiveRequest, _out: &mut dyn std::io::Write) -> Result<(), AdminError> {
    Err(AdminError::Running(data_dir.into()))
}

/// Opens the coordinator's store, refusing if the coordinator runs.
fn open_stopped(data_dir: &Path) -> Result<Store, AdminError> {
    let path = data_dir.join("coordinator.redb");
    if !path.exists() {
        return Err(AdminError::NoDatabase(data_dir.into()));
    }
    match Store::open(&path) {
        Ok(s) => Ok(s),
        Err(StoreError::Db(e)) if matches!(*e, redb::Error::DatabaseAlreadyOpen) => {
            Err(AdminError::Running(data_dir.into()))
        }
        Err(e) => Err(e.into()),
    }
}

/// The anchor of a stopped coordinator: recorded, else the store's genesis
/// with `window_ms` (from its configuration).
fn current_anchor(store: &Store, admin: &Admin, window_ms: Option<u64>) -> Result<Anchor, AdminError> {
    if let Some(a) = admin.anchor()? {
        return Ok(a);
    }
    let window_ms = window_ms.ok_or(AdminError::UnknownLength)?;
    let genesis = store.meta("genesis_ms")?.ok_or(AdminError::Corrupt("genesis (coordinator never started?)"))?;
    let genesis_ms = u64::from_le_bytes(genesis.try_into().map_err(|_| AdminError::Corrupt("genesis"))?);
    Ok(Anchor { genesis_ms, window_ms })
}

fn window_now(a: &Anchor) -> WindowId {
    now_ms().saturating_sub(a.genesis_ms) / a.window_ms.max(1)
}

/// The anchor that starts window `current + 1` at `now_ms` with windows of
/// `new_ms`: every window up to `current` ends no later than `now_ms`.
pub fn reanchor(current: WindowId, now_ms: u64, new_ms: u64) -> Result<Anchor, AdminError> {
    if new_ms == 0 {
        return Err(AdminError::Schedule(ScheduleError::ZeroLength));
    }
    let offset = current
        .checked_add(1)
        .and_then(|n| n.checked_mul(new_ms))
        .ok_or_else(|| AdminError::Invalid("window length too large".into()))?;
    let genesis_ms = now_ms
        .checked_sub(offset)
        .ok_or_else(|| AdminError::Invalid("window length too large for this network's age".into()))?;
    Ok(Anchor { genesis_ms, window_ms: new_ms })
}

/// The operator subcommands of the `coordinator` binary.
#[derive(clap::Subcommand, Debug)]
pub enum AdminCmd {
    /// Ban a miner for N windows from the current one (live on a running coordinator, else at its next start).
    Ban {
        /// Data folder.
        #[arg(long)]
        data: PathBuf,
        /// The miner's key (hex).
        key: String,
        /// Windows to ban for, from the current one.
        #[arg(long)]
        windows: u64,
        /// The coordinator's configuration (for its window length, if not recorded yet).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Lift a miner's bans (live on a running coordinator, else at its next start).
    Unban {
        /// Data folder.
        #[arg(long)]
        data: PathBuf,
        /// The miner's key (hex).
        key: String,
        /// The coordinator's configuration (for its window length, if not recorded yet).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Clear a flagged validator: its verdicts count again until another
    /// party refutes its evidence anew (on a running coordinator).
    ClearValidator {
        /// Data folder.
        #[arg(long)]
        data: PathBuf,
        /// The validator's key (hex).
        key: String,
    },
    /// Change the window length: window W+1 starts now with the new length (coordinator stopped).
    WindowLength {
        /// Data folder.
        #[arg(long)]
        data: PathBuf,
        /// The new window length in milliseconds.
        #[arg(long)]
        window_ms: u64,
        /// The coordinator's configuration (for the current length, if not recorded yet).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Create a role key file (validator, trainer) and print its public key as `public=HEX`.
    Keygen {
        /// The key file to create (refused if it exists).
        #[arg(long)]
        out: PathBuf,
    },
    /// Print a key file's public key as `public=HEX`.
    Pubkey {
        /// The key file.
        #[arg(long)]
        key: PathBuf,
    },
    /// Print the certificate fingerprint miners pin (works while the coordinator runs).
    Fingerprint {
        /// Data folder.
        #[arg(long)]
        data: PathBuf,
    },
    /// Install an operator's TLS certificate and key (PEM; e.g. signed by the
    /// network's CA, which clients then pin with `ca`) as the coordinator's; used from its next start.
    InstallCert {
        /// Data folder.
        #[arg(long)]
        data: PathBuf,
        /// The certificate (PEM).
        #[arg(long)]
        cert: PathBuf,
        /// Its private key (PEM, PKCS#8).
        #[arg(long)]
        key: PathBuf,
    },
    /// Check a configuration file as `coordinator run --config` reads it and print its main settings.
    CheckConfig {
        /// The configuration file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Print what the data folder holds: clock, counts, bans (coordinator stopped).
    Inspect {
        /// Data folder.
        #[arg(long)]
        data: PathBuf,
        /// The coordinator's configuration (for its window length, if not recorded yet).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

fn config_window_ms(config: Option<&Path>) -> Result<Option<u64>, AdminError> {
    let Some(path) = config else { return Ok(None) };
    let err = |detail: String| AdminError::Config { path: path.into(), detail };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let cfg: crate::config::Config = toml::from_str(&text).map_err(|e| err(e.to_string()))?;
    Ok(Some(cfg.window_ms))
}

/// Writes a secret file readable by its owner only.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    opts.open(path)?.write_all(bytes)
}

fn parse_key(s: &str) -> Result<PublicKey, AdminError> {
    s.parse().map_err(|e| AdminError::Invalid(format!("miner key {s:?}: {e}")))
}

/// Checks a coordinator configuration (its keys parse, its schedule is
/// valid, it authorises no `--dev` key unless `dev`, its object store
/// settings have a form that works: [`crate::archive::check_settings`]) and prints its main
/// settings as `key=value` lines, starting with `config=ok`. `path` names it
/// in errors. `check-config` and `run --check-config` (the file with the
/// flags on top).
pub fn check_config(
    cfg: &crate::config::Config,
    path: &Path,
    dev: bool,
    out: &mut dyn std::io::Write,
) -> Result<(), AdminError> {
    let err = |detail: String| AdminError::Config { path: path.to_path_buf(), detail };
    for k in cfg.validators.iter().chain(&cfg.miner_deny).chain(cfg.miner_allow.iter().flatten()).chain(&cfg.trainer) {
        k.parse::<PublicKey>().map_err(|e| err(format!("key {k:?}: {e}")))?;
    }
    Schedule::new(0, cfg.window_ms, cfg.grace_ms).map_err(|e| err(e.to_string()))?;
    if !dev {
        crate::config::refuse_dev_keys(cfg).map_err(|e| err(e.to_string()))?;
    }
    crate::config::check_values(cfg, dev).map_err(|e| err(e.to_string()))?;
    let store = crate::archive::check_settings(cfg.archive.as_deref(), cfg.store_url.as_deref()).map_err(err)?;
    let model = cfg.model.as_ref().map_or("-".into(), |m| m.display().to_string());
    let lines = [
        "config=ok".to_string(),
        format!("listen={}", cfg.listen),
        format!("http={}", cfg.http),
        format!("data_dir={}", cfg.data_dir.display()),
        format!("model={model}"),
        format!("window_ms={}", cfg.window_ms),
        format!("env={}", cfg.env.as_str()),
        format!("validators={}", cfg.validators.len()),
        format!("trainer={}", cfg.trainer.as_deref().unwrap_or("-")),
    ];
    for l in lines.into_iter().chain(store) {
        writeln!(out, "{l}").map_err(|e| AdminError::Invalid(format!("stdout: {e}")))?;
    }
    Ok(())
}

/// Runs an operator subcommand; what it did goes to stdout as `key=value` lines.
pub fn cli(cmd: &AdminCmd, out: &mut impl std::io::Write) -> Result<(), AdminError> {
    let w = |out: &mut dyn std::io::Write, s: String| {
        writeln!(out, "{s}").map_err(|e| AdminError::Invalid(format!("stdout: {e}")))
    };
    match cmd {
        AdminCmd::Ban { data, key, windows, config } => {
            let miner = parse_key(key)?;
            if *windows == 0 {
                return Err(AdminError::Invalid("--windows must be at least 1".into()));
            }
            let store = match open_stopped(data) {
                Err(AdminError::Running(_)) => {
                    return live_request(data, &LiveRequest::Ban { miner: miner.to_string(), windows: *windows }, out);
                }
                other => other?,
            };
            let admin = Admin::open(data)?;
            let now = window_now(&current_anchor(&store, &admin, config_window_ms(config.as_deref())?)?);
            let o = record_ban(&admin, &miner, now, *windows)?;
            w(out, format!("banned={miner}"))?;
            w(out, format!("window={now}"))?;
            w(out, format!("through={}", o.manual_through.unwrap_or(now)))?;
            w(out, "applied=at-start".into())?;
        }
        AdminCmd::Unban { data, key, config } => {
            let miner = parse_key(key)?;
            let store = match open_stopped(data) {
                Err(AdminError::Running(_)) => {
                    return live_request(data, &LiveRequest::Unban { miner: miner.to_string() }, out);
                }
                other => other?,
            };
            let admin = Admin::open(data)?;
            let now = window_now(&current_anchor(&store, &admin, config_window_ms(config.as_deref())?)?);
            let o = record_unban(&store, &admin, &miner)?;
            w(out, format!("unbanned={miner}"))?;
            w(out, format!("window={now}"))?;
            w(out, format!("forgiven_before={}", o.forgive_before))?;
            w(out, "applied=at-start".into())?;
        }
        AdminCmd::ClearValidator { data, key } => {
            let validator = parse_key(key)?;
            // Which refutations are cleared is known only to the running
            // coordinator (it re-derives them from the verdicts).
            match open_stopped(data) {
                Err(AdminError::Running(_)) => {
                    return live_request(data, &LiveRequest::ClearValidator { validator: validator.to_string() }, out);
                }
                Err(e) => return Err(e),
                Ok(_) => {
                    return Err(AdminError::Invalid(
                        "clear-validator works on a running coordinator: start it and run this again".into(),
                    ));
                }
            }
        }
        AdminCmd::WindowLength { data, window_ms, config } => {
            let store = open_stopped(data)?;
            let admin = Admin::open(data)?;
            let old = current_anchor(&store, &admin, config_window_ms(config.as_deref())?)?;
            let now = now_ms();
            let current = window_now(&old);
            let new = reanchor(current, now, *window_ms)?;
            admin.set_anchor(new)?;
            w(out, format!("window_ms={}", new.window_ms))?;
            w(out, format!("previous_window_ms={}", old.window_ms))?;
            w(out, format!("next_window={}", current.saturating_add(1)))?;
            w(out, format!("genesis_ms={}", new.genesis_ms))?;
            w(out, format!("now set window_ms = {} in the coordinator's configuration, then start it", new.window_ms))?;
        }
        AdminCmd::Keygen { out: path } => {
            let k = tributary_protocol::identity::Keypair::generate();
            k.save(path).map_err(|e| AdminError::Invalid(format!("{}: {e}", path.display())))?;
            w(out, format!("public={}", k.public()))?;
        }
        AdminCmd::Pubkey { key } => {
            let k = tributary_protocol::identity::Keypair::load(key)
                .map_err(|e| AdminError::Invalid(format!("{}: {e}", key.display())))?;
            w(out, format!("public={}", k.public()))?;
        }
        AdminCmd::Fingerprint { data } => {
            let path = data.join("cert.der");
            let cert = std::fs::read(&path).map_err(|e| AdminError::Invalid(format!("{}: {e}", path.display())))?;
            w(out, format!("fingerprint={}", crate::net::fingerprint(&cert)))?;
        }
        AdminCmd::InstallCert { data, cert, key } => {
            let (cert_der, key_der) =
                crate::net::read_cert_and_key(cert, key).map_err(|e| AdminError::Invalid(e.to_string()))?;
            let io = |e: std::io::Error| AdminError::Invalid(format!("{}: {e}", data.display()));
            std::fs::create_dir_all(data).map_err(io)?;
            write_private(&data.join("cert.key.der"), &key_der).map_err(io)?;
            std::fs::write(data.join("cert.der"), &cert_der).map_err(io)?;
            w(out, format!("fingerprint={}", crate::net::fingerprint(&cert_der)))?;
            w(out, "installed: the coordinator uses this certificate from its next start".into())?;
        }
        AdminCmd::CheckConfig { config } => {
            let err = |detail: String| AdminError::Config { path: config.clone(), detail };
            // Relative paths follow the file, as `coordinator run --config` reads it.
            let cfg: crate::config::Config = crate::net::cli::load_config(config)
                .map_err(|e| err(std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string)))?;
            check_config(&cfg, config, false, out)?;
        }
        AdminCmd::Inspect { data, config } => {
            let store = open_stopped(data)?;
            let admin = Admin::open(data)?;
            match current_anchor(&store, &admin, config_window_ms(config.as_deref())?) {
                Ok(a) => {
                    w(out, format!("window_ms={}", a.window_ms))?;
                    w(out, format!("window={}", window_now(&a)))?;
                }
                Err(AdminError::UnknownLength) => w(out, "window_ms=unknown".into())?,
                Err(e) => return Err(e),
            }
            w(out, format!("rollouts={}", store.rollout_count()?))?;
            w(out, format!("verdicts={}", store.verdicts()?.len()))?;
            w(out, format!("checkpoints={}", store.checkpoints()?.len()))?;
            w(out, format!("relay_entries={}", store.relay_entries()?.len()))?;
            for (m, o) in admin.overrides()? {
                let through = o.manual_through.map_or("-".to_string(), |t| t.to_string());
                w(out, format!("override={m} manual_through={through} forgive_before={}", o.forgive_before))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reanchor_continues_the_numbering_and_keeps_past_windows_closed() {
        const GENESIS: u64 = 1_700_000_000_000;
        let old = Schedule::new(GENESIS, 60_000, 5_000).unwrap();
        let now = GENESIS + 10 * 60_000 + 12_345; // window 10
        let current = old.window_at(now).unwrap();
        assert_eq!(current, 10);
        for new_ms in [1_000, 60_000, 360_000] {
            let a = reanchor(current, now, new_ms).unwrap();
            let s = Schedule::new(a.genesis_ms, a.window_ms, 500).unwrap();
            assert_eq!(s.window_at(now), Some(11));
            assert_eq!(s.opens_at(11), now);
            // Every earlier window's submissions close at most a grace after now.
            assert!(s.closes_at(10) <= now + 500);
            assert!(s.closes_at(9) <= now);
        }
        assert!(reanchor(current, now, 0).is_err());
        assert!(reanchor(u64::MAX, now, 2).is_err());
        assert!(reanchor(current, 1_000, 1_000).is_err());
    }

    #[test]
    fn recorded_length_is_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let s = schedule(dir.path(), 5_000, 1_000, 100).unwrap();
        assert_eq!(s.genesis_ms(), 5_000);
        // A restart keeps the recorded genesis even if the store's differs.
        assert_eq!(schedule(dir.path(), 9_999, 1_000, 100).unwrap().genesis_ms(), 5_000);
        assert!(matches!(
            schedule(dir.path(), 5_000, 2_000, 100),
            Err(AdminError::LengthChanged { recorded: 1_000, configured: 2_000 })
        ));
    }

    #[test]
    fn overrides_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let a = Admin::open(dir.path()).unwrap();
        let m = PublicKey([7; 32]);
        assert_eq!(a.override_of(&m).unwrap(), BanOverride::default());
        let o = BanOverride { manual_through: Some(9), forgive_before: 3 };
        a.set_override(&m, o).unwrap();
        drop(a);
        let a = Admin::open(dir.path()).unwrap();
        assert_eq!(a.overrides().unwrap(), vec![(m, o)]);
    }
}
