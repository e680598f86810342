// g[r, i] = silu(g[r, i]) * u[r, i], silu(a) = a / (1 + exp(-a)).
struct Params { ff: u32, p1: u32, p2: u32, p3: u32 }
@group(0) @binding(0) var<storage, read> info: BatchInfo;
@group(0) @binding(1) var<storage, read_write> g: array<f32>;
@group(0) @binding(2) var<storage, read> u: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.y;
    let i = gid.x;
    if (r >= info.n_rows || i >= p.ff) { return; }
    let o = r * p.ff + i;
    let a = g[o];
    g[o] = a / (1.0 + exp(-a)) * u[o];
}
