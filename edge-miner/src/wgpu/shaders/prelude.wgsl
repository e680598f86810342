// Shared by every kernel (prepended by the Rust side).
// Batch description written before each forward: rows this pass, and the
// rows whose logits the LM head computes.
struct BatchInfo { n_rows: u32, lm_row0: u32, lm_rows: u32, pad: u32 }
// One batch row: the token fed, its absolute position and its KV sequence.
struct RowInfo { token: u32, pos: u32, seq: u32, pad: u32 }

// BF16 is stored two per u32 (little-endian: element 2i in the low half).
fn bf16_lo(w: u32) -> f32 { return bitcast<f32>(w << 16u); }
fn bf16_hi(w: u32) -> f32 { return bitcast<f32>(w & 0xffff0000u); }
