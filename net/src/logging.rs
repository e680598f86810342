//! One logging set-up for every role's binary: `tracing` to **stderr**
//! (stdout is for results scripts parse, such as `miner=<key>`), filtered by
//! `RUST_LOG` or, when it is unset, by the role's default directives.
//!
//! Made for log files and journald as much as for a terminal: colour codes
//! only when stderr is a terminal and `NO_COLOR` is unset or empty
//! (<https://no-color.org>); one JSON object per line with `--log-format
//! json` ([`LogArgs`]); and no write can panic or block the process — a
//! closed stderr (`| head`, a terminal that went away, `ssh host 'role &'`)
//! loses the lines, nothing else (tracing-subscriber otherwise reports its
//! own write errors with `eprintln!`, which panics on a closed stderr in
//! whatever task was logging).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The default filter when `RUST_LOG` is unset: our own crates at `info`;
/// llama.cpp's own log (routed into `tracing` under the target
/// `llama-cpp-2`) only from `warn`, since it prints every tensor at load.
pub const DEFAULT_FILTER: &str = "info,llama-cpp-2=warn";

/// How log lines are written.
#[derive(clap::ValueEnum, Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event (colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per event and line (timestamp, level, target, fields).
    Json,
}

/// The logging flag every binary takes, before or after its subcommand.
#[derive(clap::Args, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogArgs {
    /// Log format on stderr: text (colour only on a terminal, never with NO_COLOR set) or json (one object per line).
    #[arg(long, global = true, value_enum, env = "TRIBUTARY_LOG_FORMAT", default_value_t)]
    pub log_format: LogFormat,
}

/// Whether log lines to stderr get colour codes: stderr is a terminal and
/// `NO_COLOR` is unset or empty.
pub fn colour_on_stderr() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Installs the process's subscriber: text on stderr, `RUST_LOG` or
/// `default` ([`init_logging`] with [`LogFormat::Text`]).
pub fn init_tracing(default: &str) {
    init_logging(default, LogFormat::Text);
}

/// Installs the process's subscriber: stderr in `format`, `RUST_LOG` or
/// `default`, colour as [`colour_on_stderr`] says, write errors dropped.
/// Calling it twice keeps the first (tests may start several roles in one
/// process).
pub fn init_logging(default: &str, format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).log_internal_errors(false);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(colour_on_stderr()).try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
}

/// Writes one result for scripts (a `key=value` line, or several) to stdout
/// with its newline, and flushes it: `announce(format_args!("miner={key}"))`.
/// A reader that went away (a script that read the address and quit, a
/// closed terminal) is logged and otherwise ignored: a service keeps running
/// without an audience, where `println!` would panic and `writeln!(..)?`
/// would end the process.
pub fn announce(lines: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{lines}").and_then(|()| out.flush()) {
        tracing::warn!("stdout is closed ({e}); the lines it missed: {}", lines.to_string().replace('\n', "; "));
    }
}

/// Milliseconds since the Unix epoch: the clock every role reads for window
/// times (0 if the system clock is before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_filter_parses() {
        let f: EnvFilter = DEFAULT_FILTER.parse().expect("valid directives");
        assert!(f.to_string().contains("llama-cpp-2=warn"), "{f}");
    }

    #[test]
    fn the_clock_is_past_2025() {
        assert!(now_ms() > 1_735_689_600_000);
    }
}
