//! The command line and configuration files the client roles share: the
//! flags that say how to reach the coordinator and where the data folder is
//! ([`CoordinatorArgs`], flattened into each role's `run`), and the reading
//! of a role's TOML file ([`load_config`]) with its relative paths taken
//! relative to the file's folder.
//!
//! Every binary also shares [`version`] (its `--version`: the package
//! version, the git commit and the wire protocol's version) and
//! [`print_completions`] (its `completions SHELL` subcommand).
//!
//! Each role keeps its own help wording for these flags (its binary
//! overrides a flag's help with clap's `mut_arg`), its own config struct and
//! its own defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::wire::Role;

/// Every binary's `--version`: `0.1.0 (commit 1a2b3c4d5e6f, protocol 6)`.
/// The commit is stamped at build time (`net/build.rs`; `unknown` when built
/// from a tarball without `.git` and without `TRIBUTARY_GIT_COMMIT`).
pub fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| {
        format!(
            "{} (commit {}, protocol {})",
            env!("CARGO_PKG_VERSION"),
            env!("TRIBUTARY_GIT_COMMIT"),
            tributary_protocol::wire::PROTOCOL_VERSION
        )
    })
}

/// The shells [`print_completions`] writes for.
pub use clap_complete::Shell;

/// Writes `cmd`'s completion script for `shell` to stdout (`ROLE completions
/// bash > /etc/bash_completion.d/ROLE`, or `source <(ROLE completions bash)`).
pub fn print_completions(mut cmd: clap::Command, shell: Shell) {
    let name = cmd.get_name().to_string();
    clap_complete::generate(shell, &mut cmd, name, &mut std::io::stdout());
}

/// An error and its causes on one line, `outer: cause: root`, each cause
/// once: a cause whose text its parent's message already contains (a
/// `thiserror` message that prints its `#[source]`) is not repeated.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let m = c.to_string();
        if !m.is_empty() && !text.contains(&m) {
            text.push_str(": ");
            text.push_str(&m);
        }
        cause = c.source();
    }
    text
}

/// How every binary ends: 0 on success; otherwise `error: ...` on stderr
/// ([`error_chain`]: each cause once, no backtrace whatever
/// `RUST_BACKTRACE` says: a wrong flag or a missing file is not a crash) and
/// exit status 1. A closed stderr loses the line, nothing else.
pub fn exit_code<E>(result: Result<(), E>) -> std::process::ExitCode
where
    E: AsRef<dyn std::error::Error + Send + Sync + 'static>,
{
    use std::io::Write;
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {}", error_chain(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

/// How a client finds and pins its coordinator, and where it keeps its data.
/// Each overrides the config file's key of the same name.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct CoordinatorArgs {
    /// Join a `coordinator run --dev` network with the role's well-known dev key.
    #[arg(long)]
    pub dev: bool,
    /// Configuration file (TOML); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the resolved configuration (TOML) and exit without connecting.
    #[arg(long)]
    pub check_config: bool,
    /// The coordinator's QUIC address, HOST:PORT.
    #[arg(long)]
    pub coordinator: Option<String>,
    /// The coordinator's certificate fingerprint (hex).
    #[arg(long, conflicts_with = "ca")]
    pub fingerprint: Option<String>,
    /// CA certificate (PEM) that signed the coordinator's certificate.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// The coordinator's key (hex, `coordinator pubkey --key DATA/coordinator.key`): a coordinator with
    /// another key is refused. Default: the key pinned on first sight in the
    /// data folder (none with --dev).
    #[arg(long)]
    pub coordinator_key: Option<String>,
    /// Data folder.
    #[arg(long)]
    pub data: Option<PathBuf>,
}

impl CoordinatorArgs {
    /// Puts the pin flags over a configuration's pin. Either flag replaces
    /// both keys: a client pins one way, so a `--ca` on the command line
    /// drops the file's `fingerprint` (and the other way round).
    pub fn override_pin(&self, fingerprint: &mut Option<String>, ca: &mut Option<PathBuf>) {
        if self.fingerprint.is_some() || self.ca.is_some() {
            fingerprint.clone_from(&self.fingerprint);
            ca.clone_from(&self.ca);
        }
    }
}

/// Why a client role refuses to start: the public `--dev` keys belong to
/// `--dev` networks on one machine only.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DevKeyError {
    /// Outside `--dev`, the role's key is its public `--dev` key.
    #[error(
        "the {role} key {key} is the public --dev key (anyone can sign as it); outside --dev use a key of your own"
    )]
    DevKeyOutsideDev {
        /// The role.
        role: &'static str,
        /// The key.
        key: PublicKey,
    },
    /// `--dev` (the public key) towards a coordinator on another machine.
    #[error("--dev signs with the public {role} key and joins only a coordinator on this machine, not {addr}")]
    DevOffLoopback {
        /// The role.
        role: &'static str,
        /// The coordinator's address.
        addr: SocketAddr,
    },
}

/// Refuses the public `--dev` key of `role` outside `--dev`, and `--dev`
/// towards a coordinator that is not on loopback (a production network
/// would take the public key's verdicts or checkpoints from anyone).
pub fn refuse_dev_keys(dev: bool, role: Role, key: &PublicKey, coordinator: SocketAddr) -> Result<(), DevKeyError> {
    let role_name = role.as_str();
    if dev && !coordinator.ip().is_loopback() {
        return Err(DevKeyError::DevOffLoopback { role: role_name, addr: coordinator });
    }
    if !dev && *key == tributary_protocol::dev::key(role).public() {
        return Err(DevKeyError::DevKeyOutsideDev { role: role_name, key: *key });
    }
    Ok(())
}

/// A configuration file's paths that are relative to the file's folder
/// (data folders, model and key files, the CA certificate).
pub trait ConfigPaths {
    /// Calls `f` on every path of the configuration (absent ones skipped).
    fn for_each_path(&mut self, f: &mut dyn FnMut(&mut PathBuf));
}

/// Errors reading a configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this role (its message names an
    /// unknown key and lists the known ones).
    #[error("parsing {}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: Box<toml::de::Error>,
    },
}

/// Reads the TOML configuration file at `path`; every relative path in it
/// becomes relative to the file's folder, so a config works from any
/// current directory.
pub fn load_config<T: DeserializeOwned + ConfigPaths>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
    let mut cfg: T =
        toml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.into(), source: Box::new(source) })?;
    let base = path.parent().unwrap_or(Path::new("."));
    cfg.for_each_path(&mut |p| {
        if p.is_relative() {
            *p = base.join(&*p);
        }
    });
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Default, serde::Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Conf {
        data: PathBuf,
        ca: Option<PathBuf>,
        model: Option<PathBuf>,
        name: Option<String>,
    }

    impl ConfigPaths for Conf {
        fn for_each_path(&mut self, f: &mut dyn FnMut(&mut PathBuf)) {
            f(&mut self.data);
            for p in [&mut self.ca, &mut self.model].into_iter().flatten() {
                f(p);
            }
        }
    }

    #[test]
    fn a_cause_is_printed_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("reading x.toml: {0}")]
        struct Twice(#[source] std::io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("starting")]
        struct Outer(#[source] Twice);
        let e = Outer(Twice(std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")));
        assert_eq!(error_chain(&e), "starting: reading x.toml: no such file");
        assert!(version().contains("(commit ") && version().contains("protocol "), "{}", version());
    }

    #[test]
    fn relative_paths_follow_the_file_and_absolute_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("role.toml");
        std::fs::write(&path, "data = \"d\"\nca = \"/etc/ca.pem\"\nname = \"x/y\"\n").unwrap();
        let c: Conf = load_config(&path).unwrap();
        assert_eq!(c.data, dir.path().join("d"));
        assert_eq!(c.ca, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(c.model, None);
        assert_eq!(c.name.as_deref(), Some("x/y"), "only paths move");
    }

    #[test]
    fn unknown_keys_and_missing_files_are_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("role.toml");
        std::fs::write(&path, "zz_not_a_key = 1\n").unwrap();
        let e = load_config::<Conf>(&path).unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }), "{e:?}");
        let cause = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
        assert!(cause.contains("unknown field `zz_not_a_key`, expected one of"), "{cause}");
        let e = load_config::<Conf>(&dir.path().join("absent.toml")).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }), "{e:?}");
    }

    #[test]
    fn dev_keys_only_with_dev_and_dev_only_on_loopback() {
        let local: SocketAddr = "127.0.0.1:4433".parse().unwrap();
        let remote: SocketAddr = "203.0.113.7:4433".parse().unwrap();
        for role in [Role::Validator, Role::Trainer] {
            let dev_key = tributary_protocol::dev::key(role).public();
            let own = tributary_protocol::identity::Keypair::from_seed([41; 32]).public();
            assert!(matches!(refuse_dev_keys(false, role, &dev_key, local), Err(DevKeyError::DevKeyOutsideDev { .. })));
            assert!(matches!(refuse_dev_keys(true, role, &dev_key, remote), Err(DevKeyError::DevOffLoopback { .. })));
            assert_eq!(refuse_dev_keys(true, role, &dev_key, local), Ok(()));
            assert_eq!(refuse_dev_keys(false, role, &own, remote), Ok(()));
            assert!(
                refuse_dev_keys(false, role, &dev_key, local).unwrap_err().to_string().contains("public --dev key")
            );
        }
    }

    #[derive(clap::Parser, Debug)]
    #[command(mut_arg("data", |a| a.help("Role data folder")))]
    struct Cli {
        #[command(flatten)]
        common: CoordinatorArgs,
        #[arg(long)]
        extra: Option<u32>,
    }

    #[test]
    fn a_pin_flag_replaces_both_pins_and_the_two_conflict() {
        let cli = Cli::try_parse_from(["x", "--ca", "c.pem", "--extra", "3"]).unwrap();
        let (mut fp, mut ca) = (Some("ab".to_string()), None);
        cli.common.override_pin(&mut fp, &mut ca);
        assert_eq!((fp, ca), (None, Some(PathBuf::from("c.pem"))));
        let none = Cli::try_parse_from(["x"]).unwrap();
        let (mut fp, mut ca) = (Some("ab".to_string()), None);
        none.common.override_pin(&mut fp, &mut ca);
        assert_eq!((fp.as_deref(), ca), (Some("ab"), None));
        assert!(Cli::try_parse_from(["x", "--ca", "c.pem", "--fingerprint", "ab"]).is_err());
        use clap::CommandFactory;
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("Role data folder"), "{help}");
    }
}
