//! Connections: the accept loop and its per-address, per-key and total
//! connection slots, the handshake, and each connection's life (its
//! requests read in one task, its answers written in another).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::Instrument;
use tributary_protocol::identity::{self, PublicKey};
use tributary_protocol::wire::{self, Challenge, ErrorCode, ErrorFrame, Frame, Role, Tag, Welcome};

use crate::net::{self, NetError};

use super::answers::{Answer, write_answers};
use super::requests::serve_requests;
use super::*;

/// Which address prefix a connection counts against: the IPv4 address, or
/// the /64 of an IPv6 one (one host commonly holds a whole /64).
pub fn address_prefix(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[derive(Debug, Default)]
pub(super) struct ConnCounts {
    /// Connections up and not authenticated yet, oldest first (their own
    /// cap, `max_unauthenticated`: past it the oldest is closed).
    pub(super) pending: std::collections::BTreeMap<u64, quinn::Connection>,
    next_pending: u64,
    /// Authenticated connections (cap `max_connections`).
    pub(super) authed: u32,
    /// Authenticated miner connections (cap `max_connections − reserved_role_connections`).
    pub(super) miners: u32,
    pub(super) by_prefix: HashMap<IpAddr, u32>,
    pub(super) by_key: HashMap<PublicKey, u32>,
}

impl ConnCounts {
    fn gauge(&self) {
        let pending = self.pending.len() as f64;
        metrics::gauge!("tributary_connections").set(f64::from(self.authed) + pending);
        metrics::gauge!("tributary_connections_unauthenticated").set(pending);
    }
}

/// An open connection's place in its source's count, for its whole life.
pub(super) struct AddressSlot {
    sh: Arc<Shared>,
    prefix: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut c = self.sh.conns();
        if let Some(n) = c.by_prefix.get_mut(&self.prefix) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.by_prefix.remove(&self.prefix);
            }
        }
    }
}

/// A connection's place among the unauthenticated ones, until it logs in
/// or closes: a flood of connections that never authenticate fills only
/// this cap, never the slots of authenticated roles; and past the cap the
/// oldest unauthenticated connection is closed, so the flood must open
/// `max_unauthenticated` connections within one honest handshake (a few
/// round trips) to keep anyone out, against `connections_per_sec` per
/// address.
pub(super) struct PendingSlot {
    sh: Arc<Shared>,
    id: u64,
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        let mut c = self.sh.conns();
        c.pending.remove(&self.id);
        c.gauge();
    }
}

/// An authenticated connection's place in its key's and its role's counts.
pub(super) struct KeySlot {
    sh: Arc<Shared>,
    key: PublicKey,
    miner: bool,
}

impl Drop for KeySlot {
    fn drop(&mut self) {
        let mut c = self.sh.conns();
        c.authed = c.authed.saturating_sub(1);
        if self.miner {
            c.miners = c.miners.saturating_sub(1);
        }
        if let Some(n) = c.by_key.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.by_key.remove(&self.key);
            }
        }
        c.gauge();
    }
}

impl Shared {
    /// A new connection's place in its source's count.
    pub(super) fn take_address_slot(self: &Arc<Self>, ip: IpAddr) -> Result<AddressSlot, &'static str> {
        let prefix = address_prefix(ip);
        let mut c = self.conns();
        let n = c.by_prefix.entry(prefix).or_insert(0);
        if *n >= self.limits.max_connections_per_address {
            return Err("max_connections_per_address");
        }
        *n += 1;
        Ok(AddressSlot { sh: self.clone(), prefix })
    }

    /// An established connection's place among the unauthenticated ones;
    /// at the cap, the oldest of them is closed to make room.
    pub(super) fn enter_pending(self: &Arc<Self>, conn: &quinn::Connection) -> PendingSlot {
        let mut c = self.conns();
        while c.pending.len() >= self.limits.max_unauthenticated.max(1) as usize {
            let Some((_, oldest)) = c.pending.pop_first() else { break };
            metrics::counter!("tributary_connections_refused_total", "reason" => "max_unauthenticated").increment(1);
            let remote = oldest.remote_address();
            self.warn_refusal("max_unauthenticated", || {
                format!(
                    "connection from {remote} closed before it authenticated: {} unauthenticated connections are \
                     open (cap max_unauthenticated), the oldest goes",
                    self.limits.max_unauthenticated
                )
            });
            oldest.close(1u32.into(), b"too many unauthenticated connections");
        }
        let id = c.next_pending;
        c.next_pending += 1;
        c.pending.insert(id, conn.clone());
        c.gauge();
        PendingSlot { sh: self.clone(), id }
    }

    /// An authenticated connection's slot: its key's, and its role's.
    /// Miners share `max_connections − reserved_role_connections`; the
    /// validators and the trainer may use every slot, so however many
    /// miner connections are open, the network's own roles get in.
    pub(super) fn take_key_slot(self: &Arc<Self>, role: Role, key: PublicKey) -> Result<KeySlot, &'static str> {
        let l = &self.limits;
        let mut c = self.conns();
        if c.by_key.get(&key).is_some_and(|n| *n >= l.max_connections_per_key) {
            return Err("max_connections_per_key");
        }
        let miner = role == Role::Miner;
        let miner_cap = l.max_connections.saturating_sub(l.reserved_role_connections);
        if c.authed >= l.max_connections || (miner && c.miners >= miner_cap) {
            return Err("max_connections");
        }
        *c.by_key.entry(key).or_insert(0) += 1;
        c.authed += 1;
        if miner {
            c.miners += 1;
        }
        c.gauge();
        Ok(KeySlot { sh: self.clone(), key, miner })
    }
}

/// A running QUIC server.
pub struct Server {
    /// The bound address.
    pub addr: SocketAddr,
    /// The endpoint.
    pub endpoint: quinn::Endpoint,
    /// Shared state.
    pub shared: Arc<Shared>,
}

impl Server {
    /// Binds and starts accepting connections.
    pub fn start(
        listen: SocketAddr,
        cert_der: Vec<u8>,
        key_der: Vec<u8>,
        shared: Arc<Shared>,
    ) -> Result<Self, NetError> {
        // The reset key follows the certificate key: after a restart on the
        // same folder, the predecessor's clients are reset at once.
        let endpoint = net::server_endpoint(listen, cert_der, key_der)?;
        let addr = endpoint.local_addr()?;
        let ep = endpoint.clone();
        let sh = shared.clone();
        tokio::spawn(async move {
            while let Some(incoming) = ep.accept().await {
                // Address validation first (QUIC Retry): a spoofed source never
                // returns the token, so it costs no state and no per-address budget.
                if !incoming.remote_address_validated() {
                    if incoming.may_retry() {
                        let _ = incoming.retry();
                    } else {
                        incoming.ignore();
                    }
                    continue;
                }
                let remote = incoming.remote_address();
                let prefix = address_prefix(remote.ip());
                if sh.conn_limit.check_key(&prefix).is_err() {
                    metrics::counter!("tributary_connections_refused_total", "reason" => "rate_limited").increment(1);
                    sh.warn_refusal("connection_rate", || {
                        format!("connection refused: more than {}/s from {prefix}", sh.limits.connections_per_sec)
                    });
                    incoming.refuse();
                    continue;
                }
                let slot = match sh.take_address_slot(remote.ip()) {
                    Ok(s) => s,
                    Err(which) => {
                        metrics::counter!("tributary_connections_refused_total", "reason" => which).increment(1);
                        let (total, here) = sh.connections(remote.ip());
                        sh.warn_refusal(which, || {
                            format!(
                                "connection refused ({which}): {total} open, {here} from {prefix} (cap {})",
                                sh.limits.max_connections_per_address
                            )
                        });
                        incoming.refuse();
                        continue;
                    }
                };
                let sh = sh.clone();
                tokio::spawn(async move {
                    match incoming.await {
                        Ok(conn) => {
                            let pending = sh.enter_pending(&conn);
                            if let Err(e) = handle_connection(conn, sh, pending).await {
                                tracing::debug!(error = %e, "connection ended");
                            }
                        }
                        Err(e) => tracing::debug!(error = %e, "handshake failed"),
                    }
                    drop(slot);
                });
            }
        });
        // Idle keys and addresses leave the limiters and the relay's books;
        // closed windows leave the core's books; windows past the retention
        // leave the store.
        let weak = Arc::downgrade(&shared);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(30)).await;
                let Some(sh) = weak.upgrade() else { break };
                sh.prune_limiters();
                sh.prune_books(now_ms());
                let s = sh.clone();
                let _ = tokio::task::spawn_blocking(move || s.apply_retention(now_ms())).await;
            }
        });
        Ok(Self { addr, endpoint, shared })
    }
}

/// Answers queued per connection (request/response clients have a few in flight).
pub(super) const ANSWER_QUEUE: usize = 64;

pub(super) async fn send_error(send: &mut quinn::SendStream, code: ErrorCode, detail: &str) {
    let _ = net::write_frame(send, &Frame::Error(ErrorFrame { code, detail: detail.into() })).await;
}

pub(super) async fn handle_connection(
    conn: quinn::Connection,
    sh: Arc<Shared>,
    pending: PendingSlot,
) -> Result<(), NetError> {
    // One deadline for the first stream and the whole handshake: a
    // connection that never opens a stream, or stalls in the handshake, goes.
    let deadline = Duration::from_millis(sh.limits.handshake_timeout_ms.max(1));
    let hs = tokio::time::timeout(deadline, async {
        let (mut send, mut recv) = conn.accept_bi().await?;
        let r = handshake(&conn, &mut send, &mut recv, &sh).await;
        Ok::<_, NetError>((send, recv, r))
    })
    .await;
    // Logged in (its key slot taken) or refused: no longer unauthenticated.
    drop(pending);
    let (send, mut recv, (role, peer, _key_slot)) = match hs {
        Ok(Ok((send, recv, Ok(Some(x))))) => (send, recv, x),
        Ok(Ok((mut send, _, Ok(None)))) => {
            linger(&mut send).await;
            conn.close(1u32.into(), b"handshake refused");
            return Ok(());
        }
        Ok(Ok((mut send, _, Err(e)))) => {
            // A framing error before login: a typed error, then a close
            // with a reason (as after login), not a bare drop.
            if let NetError::Wire(w) = &e {
                metrics::counter!("tributary_frames_refused_total", "reason" => "malformed").increment(1);
                send_error(&mut send, ErrorCode::Malformed, &w.to_string()).await;
                linger(&mut send).await;
            }
            conn.close(pre_login_code(&e), pre_login_reason(&e));
            return Err(e);
        }
        Ok(Err(e)) => {
            conn.close(pre_login_code(&e), pre_login_reason(&e));
            return Err(e);
        }
        Err(_) => {
            metrics::counter!("tributary_connections_refused_total", "reason" => "handshake_timeout").increment(1);
            let remote = conn.remote_address();
            sh.warn_refusal("handshake_timeout", || {
                format!("connection from {remote} closed: no handshake within {deadline:?}")
            });
            conn.close(1u32.into(), b"handshake timeout");
            return Ok(());
        }
    };
    let span = tracing::info_span!("peer", role = role.as_str(), key = %peer.short());
    span.in_scope(|| tracing::info!("authenticated"));
    // Answers go out in request order, as their results become ready.
    let (ans_tx, ans_rx) = mpsc::channel::<Answer>(ANSWER_QUEUE);
    let writer = tokio::spawn(write_answers(sh.clone(), send, conn.clone(), (role, peer), ans_rx));
    let result = serve_requests(&conn, &mut recv, &sh, role, peer, &ans_tx).instrument(span.clone()).await;
    span.in_scope(|| tracing::debug!(?result, "connection finished"));
    drop(ans_tx);
    if let Ok(mut send) = writer.await
        && !matches!(result, Ok(false))
    {
        linger(&mut send).await;
    }
    match &result {
        Err(NetError::Wire(_)) => conn.close(2u32.into(), b"malformed frame"),
        Ok(true) => conn.close(3u32.into(), b"protocol violation"),
        _ => {}
    }
    result.map(|_| ())
}

/// The close code of a connection whose handshake failed with `e`: 2 for
/// a malformed frame (as after login), 1 otherwise (a refused handshake).
fn pre_login_code(e: &NetError) -> quinn::VarInt {
    if matches!(e, NetError::Wire(_)) { 2u32.into() } else { 1u32.into() }
}

/// The reason sent with [`pre_login_code`].
fn pre_login_reason(e: &NetError) -> &'static [u8] {
    match e {
        NetError::Wire(_) => b"malformed frame",
        _ => b"handshake failed",
    }
}

/// Finishes the stream and gives the peer a bounded moment to read the last
/// frame before the connection is closed (a close discards unsent data).
pub(super) async fn linger(send: &mut quinn::SendStream) {
    let _ = send.finish();
    let _ = tokio::time::timeout(Duration::from_millis(500), send.stopped()).await;
}

/// The handshake: `Hello`, `Challenge`, `Auth` (a signature bound to this
/// TLS session, [`net::handshake_message`]), `Welcome`. The key's
/// connection slot is taken before the welcome.
pub(super) async fn handshake(
    conn: &quinn::Connection,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
    sh: &Arc<Shared>,
) -> Result<Option<(Role, PublicKey, KeySlot)>, NetError> {
    let only = |want: Tag| move |tag: Tag, _| if tag == want { Ok(()) } else { Err(NetError::Unexpected(tag)) };
    let hello = match net::read_frame_with(recv, only(Tag::Hello)).await {
        Ok(Some(Frame::Hello(h))) => h,
        Ok(_) | Err(NetError::Unexpected(_)) => {
            send_error(send, ErrorCode::UnexpectedFrame, "expected Hello").await;
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    if hello.version != wire::PROTOCOL_VERSION {
        send_error(send, ErrorCode::Version, "unsupported protocol version").await;
        return Ok(None);
    }
    if !sh.core().access().permits(hello.role, &hello.key) {
        metrics::counter!("tributary_connections_refused_total", "reason" => "unauthorized").increment(1);
        sh.warn_refusal("unauthorized", || {
            format!("handshake refused: key {} may not take role {}", hello.key.short(), hello.role.as_str())
        });
        send_error(send, ErrorCode::Unauthorized, "key may not take this role").await;
        return Ok(None);
    }
    let nonce: [u8; 32] = rand::random();
    let coordinator = sh.key.public();
    let proof = sh.key.sign(identity::domain::COORDINATOR_HANDSHAKE, &net::coordinator_proof_message(conn, &nonce)?);
    net::write_frame(send, &Frame::Challenge(Challenge { nonce, coordinator, proof })).await?;
    let auth = match net::read_frame_with(recv, only(Tag::Auth)).await {
        Ok(Some(Frame::Auth(a))) => a,
        Ok(_) | Err(NetError::Unexpected(_)) => {
            send_error(send, ErrorCode::UnexpectedFrame, "expected Auth").await;
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let msg = net::handshake_message(conn, &nonce, &coordinator, &hello)?;
    if hello.key.verify(identity::domain::HANDSHAKE, &msg, &auth.signature).is_err() {
        metrics::counter!("tributary_connections_refused_total", "reason" => "bad_handshake").increment(1);
        sh.warn_refusal("bad_handshake", || {
            format!("handshake refused: key {} signature does not verify on this session", hello.key.short())
        });
        send_error(send, ErrorCode::BadHandshake, "signature does not verify").await;
        return Ok(None);
    }
    let slot = match sh.take_key_slot(hello.role, hello.key) {
        Ok(slot) => slot,
        Err(which) => {
            metrics::counter!("tributary_connections_refused_total", "reason" => which).increment(1);
            let l = &sh.limits;
            sh.warn_refusal(which, || {
                format!(
                    "handshake refused ({which}): key {} as {}; caps: {} per key, {} authenticated ({} of them for \
                     miners)",
                    hello.key.short(),
                    hello.role.as_str(),
                    l.max_connections_per_key,
                    l.max_connections,
                    l.max_connections.saturating_sub(l.reserved_role_connections)
                )
            });
            let detail = if which == "max_connections_per_key" {
                "too many connections for this key"
            } else {
                "the coordinator is full for this role: retry later"
            };
            send_error(send, ErrorCode::RateLimited, detail).await;
            return Ok(None);
        }
    };
    let schedule = *sh.core().schedule();
    net::write_frame(send, &Frame::Welcome(Welcome { now_ms: now_ms(), schedule })).await?;
    Ok(Some((hello.role, hello.key, slot)))
}
