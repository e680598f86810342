//! One shutdown idiom for every role: a [`CancellationToken`] that a role's
//! `run` watches (it stops at once while it waits, after the unit of work in
//! progress otherwise); the binaries cancel it on SIGINT (ctrl-c) or SIGTERM
//! (what systemd and `docker stop` send) with [`on_stop_signal`], and the
//! owner of a background task cancels it when it drops the task
//! ([`crate::beacon::Contributor`]).
//!
//! A token, unlike the `watch::Receiver<bool>` it replaced in the miner, has
//! no sender that can be dropped: `cancelled()` resolves only once someone
//! called `cancel()` (there, a dropped sender made `changed()` return at once,
//! forever, and a loop waiting on it spun).

pub use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGINT or SIGTERM (on unix; ctrl-c
/// elsewhere). The handlers are installed before this returns, so a signal
/// that arrives any time after the call stops the role in order instead of
/// killing the process; the listener runs on the current tokio runtime (call
/// it from within one). Where no handler can be installed the token is never
/// cancelled (the process is stopped by other means) and a warning is logged.
pub fn on_stop_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    match StopSignals::install() {
        Ok(mut s) => {
            tokio::spawn(async move {
                let name = s.recv().await;
                // Cancelled first: the stop never waits on (or dies with) a log write.
                cancel.cancel();
                tracing::info!(signal = name, "stopping");
            });
        }
        Err(e) => tracing::warn!(error = %e, "no stop-signal handler; the process stops only when killed"),
    }
    token
}

/// Tells systemd the service is ready (a unit of `Type=notify` counts as
/// started from here, so `systemctl start` returns once the role serves);
/// a no-op outside such a unit (no `NOTIFY_SOCKET`). A failure is logged.
pub fn notify_ready() {
    #[cfg(unix)]
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "could not tell systemd the service is ready");
    }
}

/// Tells systemd the service is stopping (shown by `systemctl status`); a
/// no-op outside a `Type=notify` unit.
pub fn notify_stopping() {
    #[cfg(unix)]
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
}

/// The stop signals' streams, registered with the OS.
struct StopSignals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self { int: signal(SignalKind::interrupt())?, term: signal(SignalKind::terminate())? })
        }
        #[cfg(not(unix))]
        {
            Ok(Self {})
        }
    }

    /// The name of the first signal received.
    async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.int.recv() => "SIGINT",
                _ = self.term.recv() => "SIGTERM",
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
            "ctrl-c"
        }
    }
}
