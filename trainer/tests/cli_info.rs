//! `trainer info FILE | head`: a reader that closes the pipe early ends the
//! output, not the process with a panic (review newcomer-and-ecosystem,
//! issue 32: "failed printing to stdout: Broken pipe").

use std::io::Read;
use std::process::{Command, Stdio};

#[test]
fn info_into_a_closed_pipe_exits_cleanly() {
    let model = tributary_assets::smollm2_q4_1();
    let mut child = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .arg("info")
        .arg(&model)
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn trainer info");
    // The reader goes away before the first line.
    drop(child.stdout.take());
    let mut err = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("stderr");
    let status = child.wait().expect("wait");
    assert!(!err.contains("panicked"), "trainer info panicked: {err}");
    assert!(status.success(), "{status}: {err}");

    // Read whole, it prints the checkpoint.
    let out = Command::new(env!("CARGO_BIN_EXE_trainer")).arg("info").arg(&model).output().expect("trainer info");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("content_id=") && text.contains("arch=llama"), "{text}");
}
