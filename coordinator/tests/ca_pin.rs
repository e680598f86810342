//! CA pinning and live operator commands: a coordinator runs with an
//! operator's certificate (signed by a CA, installed with
//! `coordinator install-cert`); a client pinning that CA connects, one
//! pinning another CA (or the self-signed certificate's old fingerprint) is
//! refused with a clear error. On that running coordinator, `coordinator
//! ban`/`unban` go through its admin socket and take effect at once.

mod common;

use common::within;
use coordinator::admin::{self, AdminCmd};
use coordinator::net::{self, NetError, Session};
use coordinator::node::{self, Config};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::Role;

/// A CA: (certificate PEM, certificate, key).
fn ca(name: &str) -> (String, rcgen::Certificate, KeyPair) {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    (cert.pem(), cert, key)
}

fn run_admin(cmd: AdminCmd) -> Result<String, admin::AdminError> {
    let mut out = Vec::new();
    admin::cli(&cmd, &mut out)?;
    Ok(String::from_utf8(out).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_pinned_clients_connect_and_others_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = Config { window_ms: 600_000, ..Config::dev(data.clone()) };
    // A self-signed certificate, as the coordinator makes by default.
    let old_fingerprint = net::fingerprint(&net::self_signed().unwrap().0);

    // The operator's CA signs the coordinator's certificate.
    let (ca_pem, ca_cert, ca_key) = ca("network CA");
    let mut ee = CertificateParams::new(vec!["coordinator.example".to_string()]).unwrap();
    ee.distinguished_name.push(DnType::CommonName, "coordinator");
    let ee_key = KeyPair::generate().unwrap();
    let ee_cert = ee.signed_by(&ee_key, &ca_cert, &ca_key).unwrap();
    let files = dir.path();
    std::fs::write(files.join("ca.pem"), &ca_pem).unwrap();
    std::fs::write(files.join("coordinator.pem"), ee_cert.pem()).unwrap();
    std::fs::write(files.join("coordinator.key"), ee_key.serialize_pem()).unwrap();
    // A key that is not the certificate's is refused.
    let stray = KeyPair::generate().unwrap();
    std::fs::write(files.join("stray.key"), stray.serialize_pem()).unwrap();
    let err = run_admin(AdminCmd::InstallCert {
        data: data.clone(),
        cert: files.join("coordinator.pem"),
        key: files.join("stray.key"),
    })
    .unwrap_err();
    assert!(err.to_string().contains("do not match"), "{err}");
    let out = run_admin(AdminCmd::InstallCert {
        data: data.clone(),
        cert: files.join("coordinator.pem"),
        key: files.join("coordinator.key"),
    })
    .unwrap();
    assert!(out.contains(&format!("fingerprint={}", net::fingerprint(ee_cert.der()))), "{out}");

    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    assert_eq!(node.fingerprint, net::fingerprint(ee_cert.der()));
    let live = admin::serve_live(&data, node.shared.clone()).unwrap();
    let miner = Keypair::from_seed([5; 32]);

    // Pinning the CA (read from its file, as `--ca FILE` / `ca = "FILE"` do).
    let pin = net::read_ca(&files.join("ca.pem")).unwrap();
    let s = within(Session::connect(node.quic, &pin, &miner, Role::Miner)).await.unwrap();
    assert_eq!(s.coordinator, node.shared.key.public());
    drop(s);
    // The new certificate's fingerprint works too.
    within(Session::connect(node.quic, &node.fingerprint, &miner, Role::Miner)).await.unwrap();

    // Another CA is refused, and says so.
    let (other_pem, _, _) = ca("someone else's CA");
    std::fs::write(files.join("other.pem"), &other_pem).unwrap();
    let other = net::read_ca(&files.join("other.pem")).unwrap();
    let err = within(Session::connect(node.quic, &other, &miner, Role::Miner)).await.unwrap_err();
    assert!(matches!(err, NetError::Connection(_)), "{err:?}");
    assert!(err.to_string().contains("not signed by the pinned CA"), "{err}");
    // So is a self-signed certificate's fingerprint.
    let err = within(Session::connect(node.quic, &old_fingerprint, &miner, Role::Miner)).await.unwrap_err();
    assert!(err.to_string().contains("fingerprint"), "{err}");
    // A CA file that is not PEM is a typed error before any connection.
    std::fs::write(files.join("junk.pem"), "not a certificate").unwrap();
    assert!(matches!(net::read_ca(&files.join("junk.pem")), Err(NetError::Tls(_))));

    // Live ban and unban on the running coordinator (its database is locked).
    let out =
        run_admin(AdminCmd::Ban { data: data.clone(), key: miner.public().to_string(), windows: 3, config: None })
            .unwrap();
    assert!(out.contains("applied=live"), "{out}");
    let now = node.shared.core().schedule().window_at(coordinator::server::now_ms()).unwrap();
    assert!(node.shared.core().is_banned(&miner.public(), now));
    assert!(node.shared.core().is_banned(&miner.public(), now + 2));
    assert!(!node.shared.core().is_banned(&miner.public(), now + 3));
    let out = run_admin(AdminCmd::Unban { data: data.clone(), key: miner.public().to_string(), config: None }).unwrap();
    assert!(out.contains("applied=live"), "{out}");
    assert!(!node.shared.core().is_banned(&miner.public(), now));
    // A bad request is refused with its reason; the state is untouched.
    let err =
        run_admin(AdminCmd::Ban { data: data.clone(), key: miner.public().to_string(), windows: 0, config: None })
            .unwrap_err();
    assert!(err.to_string().contains("at least 1"), "{err}");
    // Database locked but no admin socket: the command says what to do.
    drop(live);
    let ban_again = AdminCmd::Ban { data: data.clone(), key: miner.public().to_string(), windows: 2, config: None };
    let err = run_admin(ban_again).unwrap_err();
    assert!(matches!(err, admin::AdminError::Live { .. }), "{err}");
}
