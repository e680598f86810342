fn main() {
    println!("trainer");
}
