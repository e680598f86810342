//! A `--dev` coordinator with a test network's settings, as a process the
//! fault tests can `kill -9`:
//! `mesh-coordinator DATA WINDOW_MS GRACE_MS GROUPS GROUP_SIZE ROLLOUTS_PER_SEC MAX_NEW_TOKENS DIFFICULTY QUIC_PORT`.
//! Prints `quic=`, `http=`, `fingerprint=`, `checkpoint=` lines, then serves
//! until killed, or until SIGINT/SIGTERM, which drain it as `coordinator run`
//! does (`Node::shutdown`; exit 0).
//! With `MESH_ARCHIVE` (and `MESH_STORE_URL`) set, those are its `archive` and `store_url`.

use anyhow::Context;
use coordinator::node::{self, Config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [data, window_ms, grace_ms, groups, group_size, rate, tokens, difficulty, port] = args.as_slice() else {
        anyhow::bail!(
            "usage: mesh-coordinator DATA WINDOW_MS GRACE_MS GROUPS GROUP_SIZE ROLLOUTS_PER_SEC MAX_NEW_TOKENS DIFFICULTY QUIC_PORT"
        );
    };
    let mut cfg = Config::dev(data.into());
    cfg.window_ms = window_ms.parse().context("WINDOW_MS")?;
    cfg.grace_ms = grace_ms.parse().context("GRACE_MS")?;
    cfg.groups_per_miner = groups.parse().context("GROUPS")?;
    cfg.group_size = group_size.parse().context("GROUP_SIZE")?;
    cfg.rollouts_per_sec = rate.parse().context("ROLLOUTS_PER_SEC")?;
    cfg.max_new_tokens = tokens.parse().context("MAX_NEW_TOKENS")?;
    cfg.difficulty = difficulty.parse().context("DIFFICULTY")?;
    cfg.listen = ([127, 0, 0, 1], port.parse::<u16>().context("QUIC_PORT")?).into();
    cfg.archive = std::env::var("MESH_ARCHIVE").ok();
    cfg.store_url = std::env::var("MESH_STORE_URL").ok();
    let stop = tributary_net::shutdown::on_stop_signal();
    let genesis = node::prepare_genesis(&cfg)?;
    let n = node::start(&cfg, genesis).await?;
    tributary_net::announce(format_args!(
        "quic={}\nhttp={}\nfingerprint={}\ncheckpoint={genesis}",
        n.quic, n.http, n.fingerprint
    ));
    stop.cancelled().await;
    n.shutdown().await;
    Ok(())
}
