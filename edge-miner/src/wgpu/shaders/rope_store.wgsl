// RoPE (llama.cpp NORM: adjacent pairs) on q in place and on k, written with
// v into the KV cache at (seq, pos). cos/sin come from a table computed on
// the CPU in f64 (device sin/cos are not accurate for large angles).
struct Params { n_head: u32, n_kv: u32, hd: u32, cap: u32, n_seq: u32, p5: u32, p6: u32, p7: u32 }
@group(0) @binding(0) var<storage, read> info: BatchInfo;
@group(0) @binding(1) var<storage, read> rows: array<RowInfo>;
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read> kin: array<f32>;
@group(0) @binding(4) var<storage, read> vin: array<f32>;
@group(0) @binding(5) var<storage, read_write> kc: array<f32>;
@group(0) @binding(6) var<storage, read_write> vc: array<f32>;
@group(0) @binding(7) var<storage, read> rope: array<vec2<f32>>;
@group(0) @binding(8) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.y;
    let i = gid.x;
    let hp = p.hd / 2u;
    let nq = p.n_head * hp;
    if (r >= info.n_rows || i >= nq + p.n_kv * hp) { return; }
    let row = rows[r];
    if (row.pos >= p.cap || row.seq >= p.n_seq) { return; }
    let cs = rope[row.pos * hp + i % hp];
    if (i < nq) {
        let o = r * p.n_head * p.hd + 2u * i;
        let a = q[o];
        let b = q[o + 1u];
        q[o] = a * cs.x - b * cs.y;
        q[o + 1u] = a * cs.y + b * cs.x;
    } else {
        let kvd = p.n_kv * p.hd;
        let j = i - nq;
        let s = r * kvd + 2u * j;
        let dst = (row.seq * p.cap + row.pos) * kvd + 2u * j;
        let a = kin[s];
        let b = kin[s + 1u];
        kc[dst] = a * cs.x - b * cs.y;
        kc[dst + 1u] = a * cs.y + b * cs.x;
        vc[dst] = vin[s];
        vc[dst + 1u] = vin[s + 1u];
    }
}
