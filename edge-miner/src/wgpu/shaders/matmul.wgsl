// y[r, n] (+)= sum_k x[r, k] * W[n, k], W BF16 row-major [N][K] (the GGUF
// layout), f32 accumulation in strictly increasing k, one accumulator per
// output: both entry points give the same bits for the same row, whatever
// the batch. `lm != 0` reads rows lm_row0.. of x and writes rows 0.. of y.
struct Params { k: u32, n: u32, accumulate: u32, lm: u32 }
@group(0) @binding(0) var<storage, read> info: BatchInfo;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> wt: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

fn row_range() -> vec2<u32> {
    if (p.lm != 0u) { return vec2<u32>(info.lm_row0, info.lm_rows); }
    return vec2<u32>(0u, info.n_rows);
}

fn store(r: u32, n: u32, acc: f32) {
    let o = r * p.n + n;
    if (p.accumulate != 0u) { y[o] = y[o] + acc; } else { y[o] = acc; }
}

// Small batches (decode): a thread computes one output for 4 rows, reading
// each weight once for the 4.
@compute @workgroup_size(64)
fn rows4(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = gid.x;
    let rr = row_range();
    let rb = gid.y * 4u;
    if (n >= p.n || rb >= rr.y) { return; }
    let last = rr.y - 1u;
    let kh = p.k / 2u;
    let x0 = (rr.x + rb) * p.k;
    let x1 = (rr.x + min(rb + 1u, last)) * p.k;
    let x2 = (rr.x + min(rb + 2u, last)) * p.k;
    let x3 = (rr.x + min(rb + 3u, last)) * p.k;
    let wb = n * kh;
    var a0 = 0.0;
    var a1 = 0.0;
    var a2 = 0.0;
    var a3 = 0.0;
    for (var j = 0u; j < kh; j++) {
        let w = wt[wb + j];
        let w0 = bf16_lo(w);
        let w1 = bf16_hi(w);
        let c = 2u * j;
        a0 = a0 + x[x0 + c] * w0;
        a0 = a0 + x[x0 + c + 1u] * w1;
        a1 = a1 + x[x1 + c] * w0;
        a1 = a1 + x[x1 + c + 1u] * w1;
        a2 = a2 + x[x2 + c] * w0;
        a2 = a2 + x[x2 + c + 1u] * w1;
        a3 = a3 + x[x3 + c] * w0;
        a3 = a3 + x[x3 + c + 1u] * w1;
    }
    store(rb, n, a0);
    if (rb + 1u < rr.y) { store(rb + 1u, n, a1); }
    if (rb + 2u < rr.y) { store(rb + 2u, n, a2); }
    if (rb + 3u < rr.y) { store(rb + 3u, n, a3); }
}

// Larger batches (prefill): a workgroup computes a tile of 32 rows x 64
// outputs; x is staged through workgroup memory 64 columns at a time, and
// each weight pair is read once for the 32 rows.
const TR: u32 = 32u;
const TK: u32 = 64u;
var<workgroup> xs: array<f32, 2048>; // TR * TK

@compute @workgroup_size(64)
fn tile32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let rr = row_range();
    let n = wid.x * 64u + t;
    let rb = wid.y * TR;
    let live = n < p.n;
    let nn = select(0u, n, live);
    let kh = p.k / 2u;
    let wb = nn * kh;
    var acc: array<f32, 32>;
    for (var i = 0u; i < TR; i++) { acc[i] = 0.0; }
    for (var k0 = 0u; k0 < p.k; k0 += TK) {
        // stage x[rb .. rb+32, k0 .. k0+64] (zeros outside)
        for (var e = t; e < TR * TK; e += 64u) {
            let r = rb + e / TK;
            let k = k0 + e % TK;
            var v = 0.0;
            if (r < rr.y && k < p.k) { v = x[(rr.x + r) * p.k + k]; }
            xs[e] = v;
        }
        workgroupBarrier();
        let kend = min(TK, p.k - k0);
        for (var c = 0u; c < kend; c += 2u) {
            let w = wt[wb + (k0 + c) / 2u];
            let w0 = bf16_lo(w);
            let w1 = bf16_hi(w);
            for (var i = 0u; i < TR; i++) {
                acc[i] = acc[i] + xs[i * TK + c] * w0;
                acc[i] = acc[i] + xs[i * TK + c + 1u] * w1;
            }
        }
        workgroupBarrier();
    }
    if (live) {
        for (var i = 0u; i < TR; i++) {
            if (rb + i < rr.y) { store(rb + i, n, acc[i]); }
        }
    }
}
