//! One shutdown idiom for the client roles: a [`CancellationToken`] that a
//! role's `run` watches (it stops at once while it waits, after the unit of
//! work in progress otherwise); the binaries cancel it on ctrl-c
//! ([`on_ctrl_c`]), and the owner of a background task cancels it when it
//! drops the task ([`crate::beacon::Contributor`]).

pub use tokio_util::sync::CancellationToken;

/// A token cancelled on the first ctrl-c (SIGINT), by a listener spawned on
/// the current tokio runtime. Where no handler can be installed the token
/// is never cancelled (the process is stopped by other means).
pub fn on_ctrl_c() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
        }
    });
    token
}
