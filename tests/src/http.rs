//! A static HTTP/1.1 server over a folder, standing in for an object store's
//! public endpoint or a CDN in tests and benches: `GET /KEY` answers the
//! file's bytes (200) or 404, then closes the connection. It counts the body
//! bytes it served and, with [`StaticServer::tamper`] on, flips one byte of
//! every body.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A running server; dropping it does not stop it ([`StaticServer::stop`] does).
pub struct StaticServer {
    /// Where it listens (127.0.0.1).
    pub addr: SocketAddr,
    served: Arc<AtomicU64>,
    /// Flips one byte in the middle of every body served while set.
    pub tamper: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl StaticServer {
    /// Serves `root` on a free loopback port.
    pub async fn start(root: PathBuf) -> std::io::Result<StaticServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (served, tamper) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (s2, t2) = (served.clone(), tamper.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(answer(conn, root.clone(), s2.clone(), t2.clone()));
            }
        });
        Ok(StaticServer { addr, served, tamper, task })
    }

    /// `http://ADDR/`, the base URL of the folder.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Body bytes served so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::SeqCst)
    }

    /// The shared counter behind [`StaticServer::served`].
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.served.clone()
    }

    /// Stops accepting connections (the server is gone).
    pub fn stop(&self) {
        self.task.abort();
    }
}

async fn answer(mut conn: tokio::net::TcpStream, root: PathBuf, served: Arc<AtomicU64>, tamper: Arc<AtomicBool>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let key = head.split_whitespace().nth(1).unwrap_or("/").trim_start_matches('/').to_owned();
    let body = if key.contains("..") { None } else { tokio::fs::read(root.join(&key)).await.ok() };
    let reply = match body {
        Some(mut b) => {
            if tamper.load(Ordering::SeqCst) && !b.is_empty() {
                let mid = b.len() / 2;
                b[mid] ^= 0x40;
            }
            served.fetch_add(b.len() as u64, Ordering::SeqCst);
            let mut r =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", b.len()).into_bytes();
            r.extend_from_slice(&b);
            r
        }
        None => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
    };
    let _ = conn.write_all(&reply).await;
    let _ = conn.shutdown().await;
}
