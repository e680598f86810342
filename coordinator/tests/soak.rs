//! The hostile-load soak (issue 17 item 4): a `coordinator run --dev` child
//! process serves four honest miners (with proven work: a warm-up window
//! before the attack whose assignment the validator passes) for six short
//! windows while attackers
//! run network-security E1-E5 at once, each from its own loopback address:
//!
//! - E1: sessions that ask for checkpoint chunks and never read;
//! - E2/W2: a key submitting 229 KB rollouts outside the generation contract;
//! - E3: fresh keys every window, each with a bad-signature rollout (a door
//!   penalty) and a full assignment of junk rollouts within the contract;
//! - E4: connections that never open a stream, and a slowloris that declares
//!   an 8 MiB frame and sends a byte now and then;
//! - E5: Initials through a UDP relay that drops every answer (a spoofed
//!   source that never completes address validation), from the honest
//!   miners' own address.
//!
//! Then the coordinator is killed (`kill -9`) and restarted on its folder,
//! and a validator fetches every window: each acknowledged honest rollout
//! must be there. It prints honest acceptance, the coordinator's peak RSS
//! (VmHWM) and the data folder's growth, and asserts acceptance >= 99 %,
//! peak RSS <= 1 GiB, growth within the storage budget, nothing lost.

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{oversized, rollout, within};
use coordinator::net::{self, Session};
use coordinator::server::now_ms;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::{self, Keypair};
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::wire::*;

const WINDOW_MS: u64 = 3_000;
const WINDOWS: u64 = 6;
const MAX_WINDOW_MIB: u64 = 16;
/// Keys storing per window: each key's share is `MAX_WINDOW_MIB / MAX_WINDOW_MINERS` (256 KiB).
const MAX_WINDOW_MINERS: u64 = 64;
/// groups_per_miner x group_size in the soak's configuration.
const ASSIGNMENT: u64 = 16;

/// What the attackers got done (printed with the figures).
#[derive(Default)]
struct Attacks {
    hog_sessions: AtomicU64,
    oversize_refused: AtomicU64,
    sybil_keys: AtomicU64,
    idle_connections: AtomicU64,
    slowloris_bytes: AtomicU64,
    spoofed_initials: AtomicU64,
}

struct Coordinator {
    child: Child,
    quic: SocketAddr,
    fingerprint: String,
    genesis: ContentId,
    /// Held open: the child must not see a broken pipe.
    _stdout: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(config: &std::path::Path) -> Coordinator {
    let mut child = Command::new(env!("CARGO_BIN_EXE_coordinator"))
        .args(["run", "--dev", "--config"])
        .arg(config)
        .env("RUST_LOG", std::env::var("SOAK_LOG").unwrap_or_else(|_| "error".into()))
        .stdout(Stdio::piped())
        .stderr(if std::env::var_os("SOAK_LOG").is_some() { Stdio::inherit() } else { Stdio::null() })
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut get = |prefix: &str| {
        let line = lines.next().expect("coordinator exited").unwrap();
        line.strip_prefix(prefix).unwrap_or_else(|| panic!("expected {prefix}, got {line}")).to_string()
    };
    let quic = get("quic=").parse().unwrap();
    let _ = get("http=");
    let fingerprint = get("fingerprint=");
    let genesis = ContentId(hex::decode(get("checkpoint=")).unwrap().try_into().unwrap());
    let _ = get("data=");
    Coordinator { child, quic, fingerprint, genesis, _stdout: lines }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn dir_bytes(p: &std::path::Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        let m = e.metadata().unwrap();
        n += if m.is_dir() { dir_bytes(&e.path()) } else { m.len() };
    }
    n
}

/// A raw QUIC client endpoint bound to `ip` (a loopback address of its own).
fn endpoint(ip: IpAddr, pin: &str) -> quinn::Endpoint {
    let mut ep = quinn::Endpoint::client(SocketAddr::new(ip, 0)).unwrap();
    ep.set_default_client_config(net::client_config(pin).unwrap());
    ep
}

/// `Session::connect` from a chosen source address.
async fn session_from(ip: IpAddr, c: &Coord, key: &Keypair) -> Option<Session> {
    let endpoint = endpoint(ip, &c.fingerprint);
    let conn = endpoint.connect(c.quic, "localhost").ok()?.await.ok()?;
    let (mut send, mut recv) = conn.open_bi().await.ok()?;
    let hello = Hello { version: PROTOCOL_VERSION, role: Role::Miner, key: key.public() };
    net::write_frame(&mut send, &Frame::Hello(hello.clone())).await.ok()?;
    let Some(Frame::Challenge(ch)) = net::read_frame(&mut recv).await.ok()? else { return None };
    let msg = net::handshake_message(&conn, &ch.nonce, &ch.coordinator, &hello).ok()?;
    let signature = key.sign(identity::domain::HANDSHAKE, &msg);
    net::write_frame(&mut send, &Frame::Auth(Auth { signature })).await.ok()?;
    let Some(Frame::Welcome(welcome)) = net::read_frame(&mut recv).await.ok()? else { return None };
    Some(Session { conn, send, recv, coordinator: ch.coordinator, welcome, endpoint })
}

#[derive(Clone)]
struct Coord {
    quic: SocketAddr,
    fingerprint: String,
    genesis: ContentId,
}

fn ip(a: u8, b: u8) -> IpAddr {
    IpAddr::from([127, 0, a, b])
}

async fn current_window(s: &mut Session) -> Option<WindowInfo> {
    match s.request(&Frame::GetWindow(GetWindow { window: None })).await {
        Ok(Frame::WindowInfo(w)) => Some(w),
        _ => None,
    }
}

/// E1: sessions that ask for 64 chunks each and never read.
async fn relay_hog(c: Coord, n: u8, stop: Arc<AtomicBool>, a: Arc<Attacks>) {
    let mut held = Vec::new();
    let mut k = 0u32;
    while !stop.load(Ordering::Relaxed) {
        k += 1;
        let key = Keypair::from_seed(*blake3::hash(&[1, n, k as u8, (k >> 8) as u8]).as_bytes());
        if let Some(mut s) = session_from(ip(0, 10 + n), &c, &key).await {
            for _ in 0..64 {
                let _ = s.send(&Frame::GetCheckpoint(GetCheckpoint { id: c.genesis, offset: 0 })).await;
            }
            held.push(s);
            a.hog_sessions.fetch_add(1, Ordering::Relaxed);
            held.retain(|s| s.conn.close_reason().is_none());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// E2/W2: 229 KB rollouts claiming 16 384 new tokens.
async fn oversize(c: Coord, stop: Arc<AtomicBool>, a: Arc<Attacks>) {
    let key = Keypair::from_seed([2; 32]);
    while !stop.load(Ordering::Relaxed) {
        let Some(mut s) = session_from(ip(0, 20), &c, &key).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        while let Some(info) = current_window(&mut s).await {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let n = 16_384usize;
            for g in 0..info.groups_per_miner {
                let r = oversized(&info, &key, g, 0, n);
                match s.request(&Frame::Submit(Submit { seq: 0, rollout: Blob(r.encode()) })).await {
                    Ok(Frame::Refused(_)) => {
                        a.oversize_refused.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// E3: fresh keys, each with a bad-signature rollout and a junk assignment.
async fn sybils(c: Coord, stop: Arc<AtomicBool>, junk_acked: Arc<AtomicU64>, a: Arc<Attacks>) {
    let mut k = 0u32;
    while !stop.load(Ordering::Relaxed) {
        k += 1;
        let key = Keypair::from_seed(*blake3::hash(&[3, k as u8, (k >> 8) as u8]).as_bytes());
        let Some(mut s) = session_from(ip(1, (k % 200) as u8 + 1), &c, &key).await else { continue };
        let Some(info) = current_window(&mut s).await else { continue };
        a.sybil_keys.fetch_add(1, Ordering::Relaxed);
        let mut bad = rollout(&info, &key, 0, 0, 8);
        bad.signature[0] ^= 1;
        let _ = s.request(&Frame::Submit(Submit { seq: 0, rollout: Blob(bad.encode()) })).await;
        let max = info.sampling.max_new_tokens as usize;
        let junk: Vec<Blob> = (0..info.groups_per_miner)
            .flat_map(|g| (0..info.group_size).map(move |i| (g, i)))
            .map(|(g, i)| Blob(rollout(&info, &key, g, i, max).encode()))
            .collect();
        if let Ok(Frame::BatchAnswer(b)) = s.request(&Frame::SubmitBatch(SubmitBatch { seq: 1, rollouts: junk })).await
        {
            let n = b.outcomes.iter().filter(|o| matches!(o, Outcome::Stored(_))).count();
            junk_acked.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

/// E4: connections that never open a stream, and a slowloris.
async fn idlers(c: Coord, stop: Arc<AtomicBool>, a: Arc<Attacks>) {
    let ep = endpoint(ip(0, 30), &c.fingerprint);
    let mut conns = Vec::new();
    let slow_key = Keypair::from_seed([4; 32]);
    let mut slow = None;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..8 {
            if let Ok(connecting) = ep.connect(c.quic, "localhost")
                && let Ok(Ok(conn)) = tokio::time::timeout(Duration::from_secs(1), connecting).await
            {
                let _ = conn.send_datagram(vec![0u8; 1000].into());
                conns.push(conn);
                a.idle_connections.fetch_add(1, Ordering::Relaxed);
            }
        }
        conns.retain(|c| c.close_reason().is_none());
        if slow.is_none() {
            if let Some(mut s) = session_from(ip(0, 31), &c, &slow_key).await {
                let mut header = (8u32 << 20).to_le_bytes().to_vec();
                header.extend_from_slice(&(Tag::SubmitBatch as u16).to_le_bytes());
                let _ = s.send.write_all(&header).await;
                slow = Some(s);
            }
        } else if let Some(s) = &mut slow {
            if s.send.write_all(&[0u8; 64]).await.is_err() {
                slow = None;
            } else {
                a.slowloris_bytes.fetch_add(64, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// E5: Initials from the honest miners' address through a relay that drops
/// every answer, so the source never validates.
async fn spoofer(c: Coord, stop: Arc<AtomicBool>, a: Arc<Attacks>) {
    let relay = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let relay = Arc::new(relay);
    let r = relay.clone();
    let target = c.quic;
    let fwd = tokio::spawn(async move {
        let mut buf = vec![0u8; 2048];
        loop {
            let Ok((n, from)) = r.recv_from(&mut buf).await else { break };
            if from != target {
                let _ = r.send_to(&buf[..n], target).await;
            }
        }
    });
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..10 {
            let ep = endpoint(ip(0, 40), &c.fingerprint);
            if let Ok(connecting) = ep.connect(relay_addr, "localhost") {
                a.spoofed_initials.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_millis(500), connecting).await;
                    drop(ep);
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fwd.abort();
}

/// Sleeps until the wall clock reads `at_ms`.
async fn sleep_until(at_ms: u64) {
    let now = now_ms();
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    }
}

/// One honest miner: its whole assignment every window; returns (sent,
/// acknowledged digests, the other answers to its submissions).
async fn honest(c: Coord, seed: u8, windows: std::ops::Range<u64>) -> (u64, Vec<(u64, [u8; 32])>, Vec<String>) {
    let key = Keypair::from_seed([100 + seed; 32]);
    let mut s = None;
    let (mut sent, mut acked, mut other) = (0u64, Vec::new(), Vec::new());
    for w in windows {
        let mut done: HashSet<(u32, u32)> = HashSet::new();
        for _attempt in 0..5 {
            if s.is_none() {
                s = Session::connect(c.quic, &c.fingerprint, &key, Role::Miner).await.ok();
            }
            let Some(sess) = s.as_mut() else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let Ok(Frame::WindowInfo(info)) = sess.request(&Frame::GetWindow(GetWindow { window: Some(w) })).await
            else {
                s = None;
                continue;
            };
            let max = info.sampling.max_new_tokens as usize;
            let mut ok = true;
            for g in 0..info.groups_per_miner {
                for i in 0..info.group_size {
                    if done.contains(&(g, i)) {
                        continue;
                    }
                    let r = rollout(&info, &key, g, i, max);
                    match sess.request(&Frame::Submit(Submit { seq: 0, rollout: Blob(r.encode()) })).await {
                        Ok(Frame::Ack(a)) => {
                            done.insert((g, i));
                            acked.push((w, a.digest));
                        }
                        Ok(f) => other.push(format!("window {w}: {f:?}")),
                        Err(_) => ok = false,
                    }
                    if !ok {
                        break;
                    }
                }
                if !ok {
                    break;
                }
            }
            if ok {
                break;
            }
            s = None;
        }
        // The whole assignment counts, reached or not.
        sent += ASSIGNMENT;
    }
    (sent, acked, other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_miners_hold_up_under_e1_to_e5() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("coordinator.toml");
    let validator = Keypair::from_seed([250; 32]);
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\ndata_dir = {data:?}\nwindow_ms = {WINDOW_MS}\n\
             grace_ms = 300\ngroups_per_miner = 4\ngroup_size = 4\nmax_new_tokens = 32\n\
             validators = [\"{}\"]\nconnections_per_sec = 20\nmax_connections_per_address = 16\n\
             idle_timeout_ms = 2000\nhandshake_timeout_ms = 1000\nmax_window_mib = {MAX_WINDOW_MIB}\nmax_window_miners = {MAX_WINDOW_MINERS}\nmin_free_mib = 0\n",
            validator.public()
        ),
    )
    .unwrap();
    let first = spawn(&config);
    let c = Coord { quic: first.quic, fingerprint: first.fingerprint.clone(), genesis: first.genesis };
    let pid = first.child.id();
    let disk_before = dir_bytes(&data);
    let rss_start = status_kib(pid, "VmRSS:");

    // A warm-up window before the attack: the honest miners store their
    // assignment and the validator passes it, so their keys have proven
    // work (`Core::proven_miners`) and the window's slots reserved for
    // them. New keys take slots first come, first served: the Sybils of E3
    // (hundreds of fresh keys a window from 200 addresses) fill a window's
    // 64 slots in a few hundred milliseconds, and an unproven honest key
    // that arrives later is refused `WindowFull` (a race this soak lost
    // once in CI, 2026-12-05: 368/384). What holds under attack is the
    // reservation for keys with proven work, which is what this checks.
    let mut v = within(Session::connect(c.quic, &c.fingerprint, &validator, Role::Validator)).await.unwrap();
    let schedule = v.welcome.schedule;
    let warm = schedule.window_at(now_ms()).unwrap() + 1;
    sleep_until(schedule.opens_at(warm) + 100).await;
    let mut warmed = Vec::new();
    for m in 0..4u8 {
        warmed.push(tokio::spawn(honest(c.clone(), m, warm..warm + 1)));
    }
    let mut stored = Vec::new();
    for (m, h) in warmed.into_iter().enumerate() {
        let (_, acked, _) = h.await.unwrap();
        assert_eq!(acked.len() as u64, ASSIGNMENT, "warm-up: miner {m} stored {} of {ASSIGNMENT}", acked.len());
        stored.push(acked);
    }
    // Verdicts are taken once the window has closed.
    sleep_until(schedule.closes_at(warm) + 400).await;
    for (m, acked) in stored.into_iter().enumerate() {
        let miner = Keypair::from_seed([100 + m as u8; 32]).public();
        let passed: Vec<[u8; 32]> = acked.iter().map(|(_, d)| *d).collect();
        let n = passed.len() as u32;
        let body = VerdictBody {
            checked: n,
            valid: n,
            estimated_valid: n,
            passed,
            ..VerdictBody::empty(warm, miner, validator.public())
        };
        let verdict = Verdict::sign(body, &validator, &v.network());
        let answer = within(v.request(&Frame::PostVerdict(verdict))).await;
        assert!(matches!(answer, Ok(Frame::VerdictAck(_))), "warm-up verdict on miner {m}: {answer:?}");
    }
    drop(v);

    let stop = Arc::new(AtomicBool::new(false));
    let junk = Arc::new(AtomicU64::new(0));
    let at = Arc::new(Attacks::default());
    let mut attackers = Vec::new();
    for n in 0..4 {
        attackers.push(tokio::spawn(relay_hog(c.clone(), n, stop.clone(), at.clone())));
    }
    attackers.push(tokio::spawn(oversize(c.clone(), stop.clone(), at.clone())));
    attackers.push(tokio::spawn(sybils(c.clone(), stop.clone(), junk.clone(), at.clone())));
    attackers.push(tokio::spawn(idlers(c.clone(), stop.clone(), at.clone())));
    attackers.push(tokio::spawn(spoofer(c.clone(), stop.clone(), at.clone())));

    // Honest miners from the next window on, with the attack under way.
    let w0 = schedule.window_at(now_ms()).unwrap() + 1;
    let windows = w0..w0 + WINDOWS;
    let mut wait = 0;
    while now_ms() < schedule.opens_at(w0) + 100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        wait += 1;
        assert!(wait < 200);
    }
    let mut miners = Vec::new();
    for m in 0..4u8 {
        let c = c.clone();
        let windows = windows.clone();
        miners.push(tokio::spawn(async move {
            let mut sent = 0;
            let mut acked = Vec::new();
            let mut other = Vec::new();
            for w in windows {
                // A third of the way into the window: E3's fresh keys have
                // filled every slot open to new keys by then.
                sleep_until(schedule.opens_at(w) + 1000).await;
                let (s, a, o) = honest(c.clone(), m, w..w + 1).await;
                sent += s;
                acked.extend(a);
                other.extend(o);
            }
            (sent, acked, other)
        }));
    }
    let mut sent = 0u64;
    let mut acked = Vec::new();
    let mut refused = Vec::new();
    for m in miners {
        let (s, a, o) = tokio::time::timeout(Duration::from_secs(120), m).await.unwrap().unwrap();
        sent += s;
        acked.extend(a);
        refused.extend(o);
    }
    stop.store(true, Ordering::Relaxed);
    let peak_kib = status_kib(pid, "VmHWM:");
    for a in attackers {
        a.abort();
    }
    let last_close = schedule.closes_at(w0 + WINDOWS - 1);
    while now_ms() < last_close + 100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let disk_growth = dir_bytes(&data).saturating_sub(disk_before);
    drop(first); // kill -9

    let second = spawn(&config);
    let mut v = within(Session::connect(second.quic, &second.fingerprint, &validator, Role::Validator)).await.unwrap();
    let mut stored: HashSet<(u64, [u8; 32])> = HashSet::new();
    for w in w0..w0 + WINDOWS {
        let mut after = None;
        loop {
            let f = FetchRollouts { window: w, miner: None, after, limit: 256 };
            let Frame::Rollouts(r) = within(v.request(&Frame::FetchRollouts(f))).await.unwrap() else { panic!() };
            for b in &r.items {
                stored.insert((w, Rollout::decode(&b.0, &RolloutLimits::DEFAULT).unwrap().digest()));
            }
            match r.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
    }
    let lost = acked.iter().filter(|a| !stored.contains(a)).count();
    let acceptance = acked.len() as f64 / sent.max(1) as f64;
    let budget = WINDOWS.saturating_add(2) * (MAX_WINDOW_MIB << 20);
    println!(
        "soak: honest acceptance {}/{} = {:.2}% | coordinator RSS start {} MiB, peak {} MiB | data folder +{} MiB \
         (budget {} MiB) | junk rollouts stored {} | acknowledged lost {lost}",
        acked.len(),
        sent,
        100.0 * acceptance,
        rss_start / 1024,
        peak_kib / 1024,
        disk_growth >> 20,
        budget >> 20,
        junk.load(Ordering::Relaxed)
    );
    let n = |x: &AtomicU64| x.load(Ordering::Relaxed);
    println!(
        "soak attacks: E1 sessions x64 unread chunk requests {} | E2 oversize refused {} | E3 fresh keys {} | \
         E4 stream-less connections {}, slowloris bytes {} | E5 spoofed Initials {}",
        n(&at.hog_sessions),
        n(&at.oversize_refused),
        n(&at.sybil_keys),
        n(&at.idle_connections),
        n(&at.slowloris_bytes),
        n(&at.spoofed_initials)
    );
    assert!(n(&at.hog_sessions) > 0 && n(&at.sybil_keys) > 0 && n(&at.spoofed_initials) > 0);
    assert_eq!(lost, 0, "acknowledged rollouts lost");
    let first: Vec<&String> = refused.iter().take(4).collect();
    assert!(acceptance >= 0.99, "honest acceptance {acceptance}; {} other answers, the first {first:?}", refused.len());
    assert!(peak_kib <= 1 << 20, "peak RSS {peak_kib} KiB");
    assert!(disk_growth <= budget, "disk grew {disk_growth} bytes");
}
