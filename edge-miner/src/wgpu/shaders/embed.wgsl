// x[r, :] = token_embd[token(r), :] (BF16 -> f32). Thread: one pair of a row.
struct Params { d: u32, vocab: u32, p2: u32, p3: u32 }
@group(0) @binding(0) var<storage, read> info: BatchInfo;
@group(0) @binding(1) var<storage, read> rows: array<RowInfo>;
@group(0) @binding(2) var<storage, read> emb: array<u32>;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.y;
    let i = gid.x;
    let hw = p.d / 2u;
    if (r >= info.n_rows || i >= hw) { return; }
    let tok = min(rows[r].token, p.vocab - 1u);
    let w = emb[tok * hw + i];
    x[r * p.d + 2u * i] = bf16_lo(w);
    x[r * p.d + 2u * i + 1u] = bf16_hi(w);
}
