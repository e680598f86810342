//! The miner's per-token sampling work on SmolLM2's vocabulary (49 152
//! logits): the fast sampler it runs ([`sample_with_logprob`]) beside its
//! anchor, the protocol's exact f64 rule ([`sample_with_logprob_exact`]), in
//! one run. Both return the seeded inverse-CDF token and its T = 1
//! log-probability.
//!
//! `cargo bench -p tributary-protocol --bench sampling`
// criterion_group! defines an undocumented `pub fn benches`.
#![allow(missing_docs)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tributary_protocol::prf::PrfStream;
use tributary_protocol::sampling::{sample_with_logprob, sample_with_logprob_exact};

const VOCAB: usize = 49_152;

fn bench(c: &mut Criterion) {
    let mut st = PrfStream::new("bench", &[b"logits"]);
    // logits shaped like a language model's: most far below a few large ones
    let logits: Vec<f32> = (0..VOCAB)
        .map(|_| {
            let x = st.unit_f64();
            (x * x * 30.0 - 12.0) as f32
        })
        .collect();
    let draws: Vec<f64> = (0..64).map(|_| st.unit_f64()).collect();
    for t in [0.7f32, 1.0] {
        let mut g = c.benchmark_group(format!("sample T={t}"));
        g.throughput(Throughput::Elements(1));
        let mut i = 0;
        g.bench_function("exact f64 rule (anchor)", |b| {
            b.iter(|| {
                i = (i + 1) % draws.len();
                sample_with_logprob_exact(&logits, t, draws[i])
            })
        });
        g.bench_function("miner (fast)", |b| {
            b.iter(|| {
                i = (i + 1) % draws.len();
                sample_with_logprob(&logits, t, draws[i])
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
