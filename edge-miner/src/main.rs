fn main() {
    println!("edge-miner");
}
