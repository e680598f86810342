// Causal grouped-query attention of one (head, row) per workgroup over the
// row's sequence in the KV cache, positions 0..=pos. Scores go through a
// scratch buffer; max and sum use a fixed strided split plus a fixed tree,
// and the weighted sum of values runs over positions in order.
struct Params { n_head: u32, n_kv: u32, hd: u32, cap: u32, n_seq: u32, p5: u32, p6: u32, scale: f32 }
@group(0) @binding(0) var<storage, read> info: BatchInfo;
@group(0) @binding(1) var<storage, read> rows: array<RowInfo>;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> kc: array<f32>;
@group(0) @binding(4) var<storage, read> vc: array<f32>;
@group(0) @binding(5) var<storage, read_write> sc: array<f32>;
@group(0) @binding(6) var<storage, read_write> o: array<f32>;
@group(0) @binding(7) var<uniform> p: Params;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    // dispatched with exactly (n_head, n_rows) workgroups
    let h = wid.x;
    let r = wid.y;
    let row = rows[r];
    let pos = min(row.pos, p.cap - 1u);
    let seq = min(row.seq, p.n_seq - 1u);
    let n = pos + 1u;
    let kvd = p.n_kv * p.hd;
    let kvh = h / (p.n_head / p.n_kv);
    let qb = (r * p.n_head + h) * p.hd;
    let sb = (r * p.n_head + h) * p.cap;
    let cb = seq * p.cap * kvd + kvh * p.hd;

    var m = -3.0e38;
    for (var j = t; j < n; j += 64u) {
        let kb = cb + j * kvd;
        var dot = 0.0;
        for (var d = 0u; d < p.hd; d++) {
            dot = dot + q[qb + d] * kc[kb + d];
        }
        let s = dot * p.scale;
        sc[sb + j] = s;
        m = max(m, s);
    }
    red[t] = m;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k = k >> 1u) {
        if (t < k) { red[t] = max(red[t], red[t + k]); }
        workgroupBarrier();
    }
    let mx = red[0];
    workgroupBarrier();
    var sum = 0.0;
    for (var j = t; j < n; j += 64u) {
        let e = exp(sc[sb + j] - mx);
        sc[sb + j] = e;
        sum = sum + e;
    }
    red[t] = sum;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k = k >> 1u) {
        if (t < k) { red[t] = red[t] + red[t + k]; }
        workgroupBarrier();
    }
    let total = red[0];
    storageBarrier();
    for (var d = t; d < p.hd; d += 64u) {
        var acc = 0.0;
        for (var j = 0u; j < n; j++) {
            acc = acc + sc[sb + j] * vc[cb + j * kvd + d];
        }
        o[qb + d] = acc / total;
    }
}
